#include "meshtrain/data/lm_dataset.h"

#include <limits>

#include "meshtrain/core/error.h"

namespace mt::data {

DocumentDataset::DocumentDataset(std::vector<std::string> documents, TokenizeFn tokenize,
                                 DocumentDatasetOptions options)
    : documents_(std::move(documents)), tokenize_(std::move(tokenize)), options_(options) {
  MT_CHECK(tokenize_ != nullptr, "[DocumentDataset] the tokenizer function is empty");
  MT_CHECK(options_.max_len > 0, "[DocumentDataset] max_len must be positive, got ", options_.max_len);
  MT_CHECK(!documents_.empty(), "[DocumentDataset] no documents");
}

const std::string& DocumentDataset::document(int64_t index) const {
  check_index(index, size(), "DocumentDataset");
  return documents_[size_t(index)];
}

Example DocumentDataset::get(int64_t index) const {
  const std::string& doc = document(index);
  std::vector<int64_t> ids;
  ids.reserve(size_t(options_.max_len));
  if (options_.bos_id) ids.push_back(*options_.bos_id);
  const std::vector<int64_t> body = tokenize_(doc);
  ids.insert(ids.end(), body.begin(), body.end());
  if (options_.eos_id) ids.push_back(*options_.eos_id);
  const int64_t length = std::min<int64_t>(int64_t(ids.size()), options_.max_len);
  ids.resize(size_t(options_.max_len), options_.pad_id);
  return Example{{"tokens", std::move(ids)}, {"length", length}};
}

PackedDataset::PackedDataset(const std::vector<std::string>& documents, const TokenizeFn& tokenize,
                             PackedDatasetOptions options)
    : seq_len_(options.seq_len) {
  MT_CHECK(tokenize != nullptr, "[PackedDataset] the tokenizer function is empty");
  MT_CHECK(seq_len_ > 0, "[PackedDataset] seq_len must be positive, got ", seq_len_);
  bool first = true;
  for (size_t d = 0; d < documents.size(); ++d) {
    const std::vector<int64_t> ids = tokenize(documents[d]);
    if (ids.empty()) continue;
    if (!first && options.separator_id) push_token(*options.separator_id, "separator before document", d);
    first = false;
    for (int64_t id : ids) push_token(id, "document", d);
  }
  finish("PackedDataset");
}

PackedDataset::PackedDataset(const std::vector<int64_t>& tokens, int64_t seq_len) : seq_len_(seq_len) {
  MT_CHECK(seq_len_ > 0, "[PackedDataset] seq_len must be positive, got ", seq_len_);
  tokens_.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) push_token(tokens[i], "position", i);
  finish("PackedDataset");
}

void PackedDataset::push_token(int64_t id, const char* where, size_t index) {
  MT_CHECK(id >= 0 && id <= std::numeric_limits<int32_t>::max(), "[PackedDataset] token id ", id, " (", where, " ",
           index, ") is negative or does not fit in int32");
  tokens_.push_back(int32_t(id));
}

void PackedDataset::finish(const char* op) {
  const int64_t n = int64_t(tokens_.size());
  num_sequences_ = n > 0 ? (n - 1) / seq_len_ : 0;
  MT_CHECK(num_sequences_ > 0, "[", op, "] the corpus has ", n, " tokens, fewer than seq_len + 1 = ", seq_len_ + 1);
}

Example PackedDataset::get(int64_t index) const {
  check_index(index, size(), "PackedDataset");
  const auto first = tokens_.begin() + index * seq_len_;
  return Example{{"tokens", std::vector<int64_t>(first, first + seq_len_ + 1)}};
}

}  // namespace mt::data
