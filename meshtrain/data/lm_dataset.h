#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/data/dataset.h"

namespace mt::data {

// Text -> token ids. A plain function keeps this layer independent of the tokenizer
// library; it is called from the DataLoader's background thread.
using TokenizeFn = std::function<std::vector<int64_t>(const std::string&)>;

struct DocumentDatasetOptions {
  int64_t max_len = 0;               // every example has exactly max_len tokens
  int64_t pad_id = 0;                // fills the tail of short documents
  std::optional<int64_t> bos_id{};     // prepended to each document when set
  std::optional<int64_t> eos_id{};     // appended (before truncation) when set
};

// One example per document, tokenized when fetched (so tokenization overlaps compute in
// the DataLoader's thread) and truncated or padded to max_len: {"tokens": (max_len,)
// ids, "length": number of real tokens}. The seed tutorial's per-document padding.
class DocumentDataset final : public Dataset {
 public:
  DocumentDataset(std::vector<std::string> documents, TokenizeFn tokenize, DocumentDatasetOptions options);
  int64_t size() const override { return int64_t(documents_.size()); }
  Example get(int64_t index) const override;
  const std::string& document(int64_t index) const;

 private:
  std::vector<std::string> documents_;
  TokenizeFn tokenize_;
  DocumentDatasetOptions options_;
};

struct PackedDatasetOptions {
  int64_t seq_len = 0;                 // each example holds seq_len + 1 tokens (inputs and shifted targets)
  std::optional<int64_t> separator_id{}; // placed between consecutive documents when set
};

// All documents tokenized once and concatenated (with separator_id between documents),
// then cut into sequences of seq_len + 1 tokens: sequence i covers tokens
// [i*seq_len, i*seq_len + seq_len], so consecutive sequences share one boundary token and
// every token but the first is a target exactly once. The tail that does not fill a
// sequence is dropped. Examples are {"tokens": (seq_len + 1,) ids}.
class PackedDataset final : public Dataset {
 public:
  PackedDataset(const std::vector<std::string>& documents, const TokenizeFn& tokenize, PackedDatasetOptions options);
  // From an already tokenized stream.
  PackedDataset(const std::vector<int64_t>& tokens, int64_t seq_len);
  int64_t size() const override { return num_sequences_; }
  Example get(int64_t index) const override;
  int64_t num_tokens() const { return int64_t(tokens_.size()); }
  int64_t seq_len() const { return seq_len_; }

 private:
  void push_token(int64_t id, const char* where, size_t index);
  void finish(const char* op);
  std::vector<int32_t> tokens_;  // int32 halves the memory of a large corpus
  int64_t seq_len_ = 0;
  int64_t num_sequences_ = 0;
};

}  // namespace mt::data
