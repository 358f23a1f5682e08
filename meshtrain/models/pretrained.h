#pragma once
// Loading Hugging Face model directories (config.json + safetensors + tokenizer) and
// llama2.c `.bin` checkpoints into the models of this folder.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/models/bert.h"
#include "meshtrain/models/causal_lm.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/llama.h"
#include "meshtrain/models/minigpt.h"
#include "meshtrain/models/model_config.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/models/seq2seq.h"
#include "meshtrain/models/t5.h"
#include "meshtrain/models/bart.h"

namespace mt::tokenizers {
class Tokenizer;
}

namespace mt::models {

// How a checkpoint's tensors matched the model's parameters.
struct LoadReport {
  std::vector<std::string> missing;     // expected but absent: newly initialized (when allowed)
  std::vector<std::string> unexpected;  // present but unused by the model
  std::vector<std::string> ignored;     // tied copies and buffers (lm_head.weight, attn.bias, ...)
  // (checkpoint key, parameter) pairs loaded under another name: a tied weight stored only
  // under its other key (a LLaMA's lm_head.weight filling model.embed_tokens.weight).
  std::vector<std::pair<std::string, std::string>> renamed;
  bool complete() const { return missing.empty() && unexpected.empty(); }
  // HF-style warnings naming every missing and unexpected key, and the renamed ones ("" when
  // complete and nothing was renamed).
  std::string str(const std::string& architecture, const std::string& source) const;
};

// Which parameters a checkpoint may lack. A model must not run on random weights by
// accident, so by default a missing parameter is an error naming it.
enum class NewParams {
  none,   // every parameter comes from the checkpoint
  heads,  // task heads the checkpoint cannot have (BERT's classifier and pooler) are initialized
  all,    // anything missing is initialized (--allow-new-heads; training from scratch)
};

struct PretrainedOptions {
  // BERT: load as this model class instead of config.json's architectures[0] (e.g. a
  // masked-LM checkpoint as a sequence classifier: the classifier and pooler are then
  // newly initialized and cls.predictions.* unexpected, as in HF).
  std::optional<BertHead> bert_head{};
  std::optional<int64_t> num_labels;
  // BERT classifiers: the classes' names in id order (config.json's id2label/label2id);
  // sets num_labels to their count.
  std::vector<std::string> label_names{};
  RngKey init_key{0, 0};  // for newly initialized parameters
  NewParams new_params = NewParams::none;
  DType dtype = DType::f32;  // checkpoint tensors of another float dtype are converted
  bool load_tokenizer = true;
  bool print_report = true;  // print missing/unexpected keys to stderr
};

struct PretrainedModel {
  std::string model_type;    // a registered model_type (model_spec.h): "bert", "gpt2", "llama", "minigpt"
  std::string architecture;  // "BertForSequenceClassification", "GPT2LMHeadModel", ...
  std::string source;        // the directory or file it came from
  ModelConfig config;        // config.as<Gpt2Config>() etc.
  Params params;
  std::shared_ptr<tokenizers::Tokenizer> tokenizer;  // null when the directory has none
  LoadReport report;
  std::vector<int64_t> stop_tokens;  // overrides the config's eos for generation (llama2.c: BOS = 1)

  const ModelSpec& spec() const { return model_spec(model_type); }
  bool is_causal_lm() const { return spec().kind == ModelKind::decoder; }
  // The decoder for generation; throws mt::Error for BERT.
  CausalLm causal_lm() const;
  // Logits (B, T, V) of a decoder with any parameters of this model's layout (sharded ones
  // too), with dropout keyed by `dropout_key` when `train`; throws mt::Error for BERT.
  Array decoder_logits(const Params& p, const DecoderInputs& in, const RngKey& dropout_key, bool train) const;
  // The mean next-token cross-entropy of those logits against labels (B, T) (-100 ignored);
  // with config.remat() == full the head runs in recomputed chunks (chunked_lm_loss.h).
  Array decoder_loss(const Params& p, const DecoderInputs& in, const Array& labels, const RngKey& dropout_key,
                     bool train) const;
  bool is_seq2seq() const { return spec().kind == ModelKind::seq2seq; }
  // The encoder-decoder for generation, with this model's parameters or any of its layout
  // (a Trainer's, sharded ones too); throws mt::Error for other kinds.
  Seq2SeqLm seq2seq_lm() const;
  Seq2SeqLm seq2seq_lm(const Params& p) const;
  // Teacher-forced logits (B, T, V) of an encoder-decoder with any parameters of this
  // model's layout, and their mean cross-entropy against labels (B, T) (-100 ignored), the
  // head in recomputed chunks with config.remat() == full.
  Array seq2seq_logits(const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key, bool train) const;
  Array seq2seq_loss(const Params& p, const Seq2SeqInputs& in, const Array& labels, const RngKey& dropout_key,
                     bool train) const;
  // The mean cross-entropy of decoder_head(hidden) against labels: decoder_loss's and
  // seq2seq_loss's path. A linear head (ModelSpec::linear_head) runs with the loss as one
  // linear_cross_entropy (no (B·T, V) logits held; small chunks under --remat full); another
  // head is recomputed in chunks under --remat full (chunked_lm_loss.h), else composed.
  Array head_loss(const Params& p, const Array& hidden, const Array& labels, const RngKey& dropout_key,
                  bool train) const;
  ParamRoles param_roles() const;
  std::vector<ParamDef> param_defs() const;
  nlohmann::json config_json() const;
};

// `path`: a Hugging Face model directory (config.json with a registered model_type;
// model.safetensors or a sharded model.safetensors.index.json; a tokenizer when
// present), or a llama2.c `.bin` checkpoint file. A tied weight stored under either of its
// keys fills the parameter. Missing parameters throw mt::Error naming them unless
// options.new_params allows them (then they are initialized and reported); unexpected ones
// are reported; a shape mismatch throws naming the key and both shapes; an unknown
// model_type throws naming it.
PretrainedModel from_pretrained(const std::string& path, const PretrainedOptions& options = {});

// A model from an already parsed config (config.json's content) and checkpoint tensors:
// the matching step of from_pretrained.
PretrainedModel model_from_checkpoint(const nlohmann::json& config, Params checkpoint, const std::string& source,
                                      const PretrainedOptions& options = {});

// A model with freshly initialized parameters (training from scratch), from a config.json's
// content; nothing is reported.
PretrainedModel init_model(const nlohmann::json& config, const PretrainedOptions& options = {});

// llama2.c checkpoint -> LLaMA with interleaved rotary pairs (llama2.c's q/k layout).
PretrainedModel load_llama2c_model(const std::string& path, const PretrainedOptions& options = {});

// Writes config.json and model.safetensors into `dir` (created if needed).
// `dtype` is the dtype of the saved floating tensors (f32, or bf16/f16 for half the size),
// written to config.json as transformers' torch_dtype.
// Each tensor is converted and written in turn (models/save_pretrained.cpp); a LoRA model is
// saved with its adapters merged into a copy of its weights.
void save_pretrained(const PretrainedModel& model, const std::string& dir, DType dtype = DType::f32);

// One parameter, whole, on the host or a device (collective when the parameters are sharded).
using TensorFetch = std::function<Array(const std::string& path)>;
// save_pretrained of a model whose parameters are fetched one at a time, so the saving process
// holds one whole tensor at a time beside what it already has (a sharded run's export gathers
// parameter by parameter, not a copy of the model). `params`: the parameters as held, for their
// paths, dtypes and (global) shapes; `model`: the config and spec (its params are unused). Every
// process of a sharded run calls it and fetches in the same order; files are written where
// `write` is set. The bytes equal save_pretrained's. Not for LoRA models (see above).
void save_pretrained_streamed(const PretrainedModel& model, const Params& params, const TensorFetch& fetch,
                              const std::string& dir, DType dtype, bool write);

// The matching itself: the parameters of `spec`'s model with `config` from `checkpoint`.
// When no checkpoint key carries the spec's base_prefix ("bert.", "transformer.", "model.")
// but the parameters do, the checkpoint is a base model's and the prefix is added (as HF
// loads a BertModel into a head model). Tied weights are filled from whichever key holds
// them; keys matching the spec's ignored_keys are dropped silently; missing parameters that
// options.new_params allows are initialized from their defs with options.init_key (the values
// init would give them), any other missing parameter throws naming them and `source`.
Params match_checkpoint(const ModelSpec& spec, const ModelConfig& config, Params checkpoint,
                        const PretrainedOptions& options, const std::string& source, LoadReport& report);

}  // namespace mt::models
