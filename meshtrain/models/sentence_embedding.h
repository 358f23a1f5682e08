#pragma once
// Sentence embeddings from an encoder, as sentence-transformers computes them: a
// sentence-transformers folder (modules.json: Transformer -> Pooling [-> Normalize], with
// 1_Pooling/config.json and sentence_bert_config.json) over a Hugging Face BERT folder, e.g.
// all-MiniLM-L6-v2. Pooling is over the real (unmasked) tokens.
#include <string>
#include <vector>

#include "meshtrain/models/pretrained.h"

namespace mt::models {

enum class SentencePooling { mean, cls, max };

struct SentenceEmbeddingConfig {
  SentencePooling pooling = SentencePooling::mean;
  bool normalize = false;        // a Normalize module follows the pooling (unit L2 norm)
  int64_t max_seq_length = 512;  // sentence_bert_config.json's, else the model's positions
};

// Reads modules.json, 1_Pooling/config.json (the folder modules.json names) and
// sentence_bert_config.json in `dir`; a folder without modules.json is a plain encoder:
// mean pooling, no normalization. Unsupported modules or pooling modes throw mt::Error naming
// the file.
SentenceEmbeddingConfig read_sentence_embedding_config(const std::string& dir, int64_t max_positions);

// (B, H) pooled over the tokens whose mask is 1 (mask (B, T), 1 = token); mean divides by
// the count of real tokens (at least 1e-9, as sentence-transformers clamps it).
Array pool_tokens(const Array& hidden, const Array& mask, SentencePooling pooling);
// Each row divided by its L2 norm (at least 1e-12, as torch's F.normalize).
Array l2_normalize_rows(const Array& x);

// An encoder and its pooling: embeddings of texts, tokenized by the folder's tokenizer,
// truncated to max_seq_length, padded per batch.
class SentenceEmbedder {
 public:
  explicit SentenceEmbedder(const std::string& dir);
  // (texts, H) f32 embeddings; batches of `batch_size` texts.
  Array embed(const std::vector<std::string>& texts, int64_t batch_size = 32) const;
  // The encoder's last hidden states (B, T, H) for given ids and mask (B, T).
  Array hidden_states(const Array& ids, const Array& mask) const;
  // Token ids and mask (B, T) of `texts`, right-padded to the longest.
  std::pair<Array, Array> tokenize(const std::vector<std::string>& texts) const;
  const PretrainedModel& model() const { return model_; }
  const SentenceEmbeddingConfig& config() const { return config_; }

 private:
  PretrainedModel model_;
  SentenceEmbeddingConfig config_;
};

}  // namespace mt::models
