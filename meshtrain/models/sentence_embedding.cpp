#include "meshtrain/models/sentence_embedding.h"

#include <algorithm>
#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::models {

namespace fs = std::filesystem;

namespace {

// The pooling of a 1_Pooling/config.json: exactly one of the modes sentence-transformers
// writes may be on.
SentencePooling read_pooling(const std::string& path) {
  const nlohmann::json j = io::read_json_file(path);
  std::vector<std::string> on;
  for (const auto& [key, value] : j.items())
    if (key.rfind("pooling_mode_", 0) == 0 && value.is_boolean() && value.get<bool>()) on.push_back(key);
  if (on.size() != 1)
    throw Error(path + ": expected exactly one pooling_mode_* set to true, found " + std::to_string(on.size()));
  if (on[0] == "pooling_mode_mean_tokens") return SentencePooling::mean;
  if (on[0] == "pooling_mode_cls_token") return SentencePooling::cls;
  if (on[0] == "pooling_mode_max_tokens") return SentencePooling::max;
  throw Error(path + ": " + on[0] + " is not supported (mean, cls and max pooling are)");
}

}  // namespace

SentenceEmbeddingConfig read_sentence_embedding_config(const std::string& dir, int64_t max_positions) {
  SentenceEmbeddingConfig c;
  c.max_seq_length = max_positions;
  const fs::path sbert = fs::path(dir) / "sentence_bert_config.json";
  if (fs::exists(sbert)) {
    const nlohmann::json j = io::read_json_file(sbert.string());
    if (j.contains("max_seq_length") && j["max_seq_length"].is_number_integer())
      c.max_seq_length = std::min(max_positions, j["max_seq_length"].get<int64_t>());
  }
  const fs::path modules = fs::path(dir) / "modules.json";
  if (!fs::exists(modules)) return c;
  const nlohmann::json j = io::read_json_file(modules.string());
  if (!j.is_array()) throw Error(modules.string() + ": expected an array of modules");
  for (const auto& m : j) {
    const std::string type = m.value("type", "");
    const std::string path = m.value("path", "");
    if (type == "sentence_transformers.models.Transformer") continue;  // the encoder itself
    if (type == "sentence_transformers.models.Pooling") {
      c.pooling = read_pooling((fs::path(dir) / path / "config.json").string());
    } else if (type == "sentence_transformers.models.Normalize") {
      c.normalize = true;
    } else {
      throw Error(modules.string() + ": module type '" + type + "' is not supported (Transformer, Pooling, Normalize are)");
    }
  }
  return c;
}

Array pool_tokens(const Array& hidden, const Array& mask, SentencePooling pooling) {
  if (hidden.ndim() != 3 || mask.ndim() != 2 || hidden.dim(0) != mask.dim(0) || hidden.dim(1) != mask.dim(1))
    throw Error("pool_tokens: hidden " + hidden.shape().str() + " and mask " + mask.shape().str() +
                " must be (B, T, H) and (B, T)");
  if (pooling == SentencePooling::cls) return squeeze(slice(hidden, 1, 0, 1), 1);
  const Array m = expand_dims(cast(mask, hidden.dtype()), 2);  // (B, T, 1)
  if (pooling == SentencePooling::max) {
    // Padding gets a large negative value first, as sentence-transformers sets it to -1e9.
    return max(add(mul(hidden, m), mul(sub(m, 1.0), 1e9)), {1});
  }
  const Array count = sum(m, {1});
  return div(sum(mul(hidden, m), {1}), maximum(count, scalar_like(count, 1e-9)));
}

Array l2_normalize_rows(const Array& x) {
  const Array norm = sqrt(sum(mul(x, x), {-1}, true));
  return div(x, maximum(norm, scalar_like(norm, 1e-12)));
}

SentenceEmbedder::SentenceEmbedder(const std::string& dir) {
  PretrainedOptions o;
  o.bert_head = BertHead::none;
  o.print_report = false;
  model_ = from_pretrained(dir, o);
  if (!model_.config.holds<BertConfig>())
    throw Error(dir + ": sentence embeddings need a BERT encoder, config.json has model_type '" + model_.model_type + "'");
  if (!model_.tokenizer) throw Error(dir + ": no tokenizer (tokenizer.json or vocab.txt) beside the model");
  config_ = read_sentence_embedding_config(dir, model_.config.as<BertConfig>().max_position_embeddings);
  model_.tokenizer->set_truncation(tokenizers::TruncationParams{.max_length = size_t(config_.max_seq_length)});
  model_.tokenizer->set_padding(std::nullopt);
}

std::pair<Array, Array> SentenceEmbedder::tokenize(const std::vector<std::string>& texts) const {
  const std::vector<tokenizers::Encoding> enc = model_.tokenizer->encode_batch(texts);
  size_t t = 0;
  for (const auto& e : enc) t = std::max(t, e.ids.size());
  const int64_t pad = model_.config.as<BertConfig>().pad_token_id;
  std::vector<int64_t> ids(enc.size() * t, pad), mask(enc.size() * t, 0);
  for (size_t i = 0; i < enc.size(); ++i)
    for (size_t j = 0; j < enc[i].ids.size(); ++j) {
      ids[i * t + j] = enc[i].ids[j];
      mask[i * t + j] = 1;
    }
  const Shape shape{int64_t(enc.size()), int64_t(t)};
  return {Array::from_vector(ids, shape), Array::from_vector(mask, shape)};
}

Array SentenceEmbedder::hidden_states(const Array& ids, const Array& mask) const {
  return bert_encoder(model_.config.as<BertConfig>(), model_.params, BertInputs{.input_ids = ids, .attention_mask = mask});
}

Array SentenceEmbedder::embed(const std::vector<std::string>& texts, int64_t batch_size) const {
  if (batch_size < 1) throw Error("SentenceEmbedder::embed: batch_size must be >= 1, got " + std::to_string(batch_size));
  std::vector<Array> parts;
  for (size_t s = 0; s < texts.size(); s += size_t(batch_size)) {
    const std::vector<std::string> chunk(texts.begin() + s, texts.begin() + std::min(texts.size(), s + size_t(batch_size)));
    auto [ids, mask] = tokenize(chunk);
    Array e = pool_tokens(hidden_states(ids, mask), mask, config_.pooling);
    parts.push_back(config_.normalize ? l2_normalize_rows(e) : e);
  }
  if (parts.empty()) return Array::zeros(Shape{0, model_.config.as<BertConfig>().hidden_size});
  return parts.size() == 1 ? parts[0] : concatenate(parts, 0);
}

}  // namespace mt::models
