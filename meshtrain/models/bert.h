#pragma once
// BERT with Hugging Face's parameter names:
//   bert.embeddings.{word_embeddings, position_embeddings, token_type_embeddings}.weight,
//   bert.embeddings.LayerNorm.{weight,bias},
//   bert.encoder.layer.N.attention.self.{query,key,value}.{weight,bias},
//   bert.encoder.layer.N.attention.output.{dense, LayerNorm}.{weight,bias},
//   bert.encoder.layer.N.intermediate.dense.{weight,bias},
//   bert.encoder.layer.N.output.{dense, LayerNorm}.{weight,bias},
//   bert.pooler.dense.{weight,bias}                      (with a pooler),
//   classifier.{weight,bias}                              (sequence classification),
//   cls.predictions.transform.{dense,LayerNorm}.{weight,bias}, cls.predictions.bias
//                                                         (masked LM; decoder tied to word_embeddings).
// All matrices are nn.Linear [out, in].
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/common.h"
#include "meshtrain/models/lora_options.h"

namespace mt::models {

// Which model class the parameters belong to (HF's architectures[0]).
enum class BertHead {
  none,                     // BertModel: encoder + pooler
  sequence_classification,  // BertForSequenceClassification: encoder + pooler + classifier
  masked_lm,                // BertForMaskedLM / BertLMHeadModel: encoder + cls.predictions, no pooler
};

struct BertConfig {
  LoraOptions lora{};  // adapters the parameters carry (lora.h); not part of config.json
  Remat remat = Remat::none;  // what training recomputes in backward (--remat); not part of config.json
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  std::string hidden_act = "gelu";
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double classifier_dropout = -1;  // < 0: hidden_dropout_prob (HF's null)
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
  bool is_decoder = false;  // causal self-attention (BertLMHeadModel as a decoder)
  int64_t num_labels = 2;   // from num_labels or the size of id2label
  // The classes' names in id order, from id2label (empty: HF's default LABEL_i).
  std::vector<std::string> label_names;
  BertHead head = BertHead::none;
  bool add_pooling_layer = true;

  double classifier_dropout_rate() const { return classifier_dropout >= 0 ? classifier_dropout : hidden_dropout_prob; }
  // Required: vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
  // intermediate_size; the head comes from architectures[0] (default BertModel).
  static BertConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
  // Sets head (and the pooler as HF's classes do: none for masked LM).
  BertConfig with_head(BertHead h) const;
};

const char* bert_architecture(BertHead head);

std::vector<ParamDef> bert_param_defs(const BertConfig& c);
ParamRoles bert_param_roles(const BertConfig& c);
// HF init: normal(0, initializer_range) for Linear and embeddings (padding row of the
// word embeddings zeroed), zero biases, LayerNorm ones/zeros.
Params bert_init(const BertConfig& c, const RngKey& key, DType dtype = DType::f32);

struct BertInputs {
  Array input_ids{};       // (B, T) integers
  Array attention_mask{};  // (B, T) 1 = token, 0 = padding; undefined = all tokens
  Array token_type_ids{};  // (B, T); undefined = zeros
  Array position_ids{};    // (B, T) or (T,); undefined = arange(T)
};

struct BertOutputs {
  Array last_hidden_state;  // (B, T, H)
  Array pooled;             // (B, H) with a pooler, else undefined
  Array logits;             // (B, num_labels) or (B, T, V) per head, else undefined
};

// The whole model of config.head. Dropout (embeddings, attention probabilities, hidden,
// classifier) only in training.
BertOutputs bert_apply(const BertConfig& c, const Params& p, const BertInputs& in, const RngKey& dropout_key = {},
                       bool train = false);
// Pieces: encoder hidden states, pooler, heads.
Array bert_encoder(const BertConfig& c, const Params& p, const BertInputs& in, const RngKey& dropout_key = {},
                   bool train = false);
Array bert_pooler(const Params& p, const Array& hidden);                 // tanh(dense(h[:, 0]))
Array bert_mlm_logits(const BertConfig& c, const Params& p, const Array& hidden);  // (B, T, V)

}  // namespace mt::models
