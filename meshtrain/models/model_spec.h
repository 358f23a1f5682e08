#pragma once
// The model registry: one ModelSpec per config.json `model_type`, holding everything that
// differs between architectures (config parsing, parameter table, Hugging Face names,
// forward functions, what the model can do). from_pretrained, checkpoints and the CLI
// (choices, help texts, errors) read it; nothing else switches on model_type strings.
// Adding a model: its folder of files with a `<name>_model_spec()`, listed once in
// model_spec.cpp.
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/core/rng.h"
#include "meshtrain/models/causal_lm.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/model_config.h"
#include "meshtrain/models/seq2seq.h"

namespace mt::models {

struct PretrainedOptions;

// What a model is for: an encoder (BERT: classification heads over a sequence), a decoder
// language model (generation, pretraining on text), an encoder-decoder (T5, BART:
// sequence-to-sequence tasks), an image encoder (ViT: pixel_values in, no text) or an
// image-to-text model (ViT-GPT2: pixel_values in, a caption out).
enum class ModelKind { encoder, decoder, seq2seq, vision, image_to_text };

// A language model's head when it is one linear layer: logits = (hidden · hidden_scale) ·
// weightᵀ [+ bias] with these parameters and nothing else (no adapter). An empty weight: the
// head is more than that.
struct LinearHead {
  std::string weight;         // (V, C)
  std::string bias;           // (V,) or (1, V), added to every row of logits; "" for none
  double hidden_scale = 1.0;  // T5's tied head: d_model^-1/2
  bool linear() const { return !weight.empty(); }
};
// Whether `module` holds its weight and nothing else (no bias, no adapter), so that
// hidden · weightᵀ is all of it.
bool only_weight(const Params& p, const std::string& module);

struct ModelSpec {
  std::string model_type;  // config.json's "model_type"
  ModelKind kind = ModelKind::decoder;
  std::string display_name;  // "GPT-2", for help texts
  // Checkpoints of the base model carry no head prefix; loading one into a head model adds
  // it (HF loads a BertModel into BertForSequenceClassification): "bert.", "model.", ...
  std::string base_prefix;

  // config.json -> config; options may adjust it (BERT: head class, number of labels).
  std::function<ModelConfig(const nlohmann::json&, const PretrainedOptions&)> parse_config;
  std::function<nlohmann::json(const ModelConfig&)> config_json;
  // The Hugging Face class name for load reports ("GPT2LMHeadModel").
  std::function<std::string(const ModelConfig&)> architecture;
  // Every parameter: path, shape, initializer, sharding role.
  std::function<std::vector<ParamDef>(const ModelConfig&)> param_defs;
  // The same model in the layout transformers' class computes with, for save_pretrained
  // (LLaMA with llama2.c's interleaved rotary pairs: q/k rows permuted to half-split pairs,
  // which HF's config cannot express); null when every config already is. Each parameter is
  // transformed on its own (save_pretrained passes them one at a time, and no parameters to
  // learn the config).
  std::function<std::pair<ModelConfig, Params>(const ModelConfig&, Params)> to_hf_layout;
  // Checkpoint keys that are tied copies or buffers, dropped without a report (regexes).
  std::function<std::vector<std::string>(const ModelConfig&)> ignored_keys;
  // Tied weights: (parameter, other checkpoint key) pairs. A checkpoint that stores the
  // matrix only under the other key (the Hub's LLaMA with tie_word_embeddings keeps
  // lm_head.weight) fills the parameter from it; when both are stored the other is ignored.
  std::function<std::vector<std::pair<std::string, std::string>>(const ModelConfig&)> tied_keys;
  // Task-head parameters a base checkpoint cannot have (regexes): NewParams::heads lets them
  // be newly initialized (BERT's classifier and pooler for GLUE).
  std::function<std::vector<std::string>(const ModelConfig&)> head_keys;
  // Parameters that are buffers in Hugging Face (saved with the model, never trained: BART's
  // final_logits_bias), as regexes; training freezes them.
  std::vector<std::string> buffers;
  // The dense layers LoRA adapts by default (a regex searched in module paths, lora.h):
  // attention and MLP projections.
  std::string lora_targets;
  // Hugging Face's other names for config keys (its config class's attribute_map), as
  // (alias, key) pairs: a user's config may use either (models/user_config.h).
  std::vector<std::pair<std::string, std::string>> config_aliases;

  // Decoders only (null for encoders).
  std::function<CausalLm(const ModelConfig&, const Params&)> causal_lm;
  // The training forward in two parts, logits = decoder_head(decoder_hidden(inputs)): final
  // hidden states (B, T, C) with dropout keyed by `dropout_key` when training, and the output
  // head, which reads only parameters under `head_prefixes` (so it can be recomputed in
  // chunks, --remat full). Encoder-decoders set decoder_head and head_prefixes too: their
  // decoder ends in the same kind of head.
  std::function<Array(const ModelConfig&, const Params&, const DecoderInputs&, const RngKey& dropout_key, bool train)>
      decoder_hidden;
  std::function<Array(const ModelConfig&, const Params&, const Array& hidden, const RngKey& dropout_key, bool train)>
      decoder_head;
  std::vector<std::string> head_prefixes;
  // The decoder's head as one linear layer where it is exactly that (else not linear(), or
  // null): decoder_loss and seq2seq_loss then run the head and the loss as one
  // linear_cross_entropy, holding no (B·T, V) logits.
  std::function<LinearHead(const ModelConfig&, const Params&)> linear_head;
  // Encoder-decoders only (null otherwise): the model for generation, and the teacher-forced
  // training forward up to the decoder's final hidden states (B, T, C), with dropout keyed
  // by `dropout_key` when training; logits = decoder_head(seq2seq_hidden(inputs)).
  std::function<Seq2SeqLm(const ModelConfig&, const Params&)> seq2seq_lm;
  std::function<Array(const ModelConfig&, const Params&, const Seq2SeqInputs&, const RngKey& dropout_key, bool train)>
      seq2seq_hidden;
  // The config `seq2seq --config small-<type>` starts from: a small model for this
  // vocabulary and these pad / end-of-sequence ids.
  std::function<nlohmann::json(int64_t vocab_size, int64_t pad_id, int64_t eos_id)> small_seq2seq_config;
  // The config `pretrain --model <type>` starts from: a small model for this vocabulary,
  // context and end-of-text id.
  std::function<nlohmann::json(int64_t vocab_size, int64_t context, int64_t eos_id)> small_config;
};

// The spec of `model_type`; throws mt::Error naming it and the known types.
const ModelSpec& model_spec(const std::string& model_type);
// Every registered spec (of one kind when given), in registration order.
std::vector<const ModelSpec*> model_specs(std::optional<ModelKind> kind = std::nullopt);
// Their model_types, e.g. {"minigpt", "gpt2", "llama"}.
std::vector<std::string> model_types(std::optional<ModelKind> kind = std::nullopt);
// "minigpt, gpt2 or llama": for help texts and errors.
std::string model_types_text(std::optional<ModelKind> kind = std::nullopt);

// The built-in models' specs (defined beside each model).
ModelSpec bart_model_spec();
ModelSpec bert_model_spec();
ModelSpec gpt2_model_spec();
ModelSpec llama_model_spec();
ModelSpec minigpt_model_spec();
ModelSpec t5_model_spec();
ModelSpec vit_model_spec();
ModelSpec vision_encoder_decoder_model_spec();

}  // namespace mt::models
