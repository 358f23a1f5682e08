#include "meshtrain/models/seq2seq.h"

#include "meshtrain/core/error.h"
#include "meshtrain/ops/indexing.h"

namespace mt::models {

namespace {
Array row_index(const std::vector<int64_t>& rows) { return Array::from_vector(rows, Shape{int64_t(rows.size())}); }
}  // namespace

EncoderOutput EncoderOutput::select_rows(const std::vector<int64_t>& rows) const {
  const Array idx = row_index(rows);
  return {take(hidden, idx, 0), mask.defined() ? take(mask, idx, 0) : Array()};
}

void Seq2SeqCache::select_rows(const std::vector<int64_t>& rows) {
  self.select_rows(rows);
  const Array idx = row_index(rows);
  for (size_t l = 0; l < cross_keys.size(); ++l) {
    if (!cross_keys[l].defined()) continue;
    cross_keys[l] = take(cross_keys[l], idx, 0);
    cross_values[l] = take(cross_values[l], idx, 0);
  }
}

std::pair<Array, Array> Seq2SeqCache::cross(size_t layer, const std::function<std::pair<Array, Array>()>& project) {
  if (cross_keys.size() <= layer) cross_keys.resize(layer + 1), cross_values.resize(layer + 1);
  if (!cross_keys[layer].defined()) std::tie(cross_keys[layer], cross_values[layer]) = project();
  return {cross_keys[layer], cross_values[layer]};
}

Array shift_right(const Array& labels, int64_t decoder_start_token_id, int64_t pad_token_id) {
  MT_CHECK(labels.defined() && labels.ndim() == 2 && is_integer(labels.dtype()),
           "[seq2seq] labels must be integer (B, T), got ", labels.defined() ? labels.str() : "undefined");
  const int64_t b = labels.dim(0), t = labels.dim(1);
  std::vector<int64_t> in = labels.to_ints(), out(in.size());
  for (int64_t r = 0; r < b; ++r) {
    out[size_t(r * t)] = decoder_start_token_id;
    for (int64_t j = 1; j < t; ++j) {
      const int64_t v = in[size_t(r * t + j - 1)];
      out[size_t(r * t + j)] = v == -100 ? pad_token_id : v;
    }
  }
  return Array::from_vector(out, Shape{b, t});
}

}  // namespace mt::models
