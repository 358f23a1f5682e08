#pragma once
// Tiny Shakespeare as a byte-level language-modelling set, for the Trainer's tests: packed
// sequences of the play's bytes and the collate function that turns them into next-token
// batches (ids and labels, each (n, seq_len)). Header-only: the tests that include it carry
// MT_DATA_DIR.
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/data/lm_dataset.h"
#include "meshtrain/train/trainer.h"

namespace mt::testing {

// The play's first `text_bytes` bytes, packed into sequences of seq_len + 1 byte ids.
inline std::shared_ptr<const data::Dataset> shakespeare_bytes(int64_t seq_len, size_t text_bytes) {
  const std::string path = std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt";
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MT_CHECK(text.size() > 1000000u, "[shakespeare_lm] ", path, " holds ", text.size(), " bytes, not the whole play");
  text.resize(text_bytes);
  std::vector<int64_t> bytes(text.begin(), text.end());
  for (auto& b : bytes) b = uint8_t(b);
  return std::make_shared<data::PackedDataset>(bytes, seq_len);
}

// Sequences of seq_len + 1 tokens -> {"ids": first seq_len, "labels": last seq_len}.
inline train::Batch next_token_batch(const std::vector<data::Example>& examples) {
  const int64_t n = int64_t(examples.size()), t = int64_t(examples[0].tokens("tokens").size()) - 1;
  std::vector<int64_t> ids, labels;
  for (const auto& e : examples) {
    const std::vector<int64_t>& tok = e.tokens("tokens");
    ids.insert(ids.end(), tok.begin(), tok.end() - 1);
    labels.insert(labels.end(), tok.begin() + 1, tok.end());
  }
  return train::Batch{{"ids", Array::from_vector(ids, {n, t})}, {"labels", Array::from_vector(labels, {n, t})}};
}

}  // namespace mt::testing
