#include "meshtrain/models/seq2seq.h"

#include "meshtrain/core/error.h"
#include "meshtrain/ops/indexing.h"

namespace mt::models {

namespace {
Array row_index(const std::vector<int64_t>& rows) { return Array::from_vector(rows, Shape{int64_t(rows.size())}); }

void check_ids(const Array& ids, const char* name, const char* model) {
  MT_CHECK(ids.defined() && ids.ndim() == 2 && is_integer(ids.dtype()) && ids.dim(1) > 0, "[", model, "] ", name,
           " must be integer (B, T) with T > 0, got ", ids.defined() ? ids.str() : "undefined");
}
}  // namespace

Array source_mask(const Array& input_ids, const Array& attention_mask, const char* model) {
  check_ids(input_ids, "input_ids", model);
  const Array mask = padding_mask(attention_mask, model);
  if (mask.defined())
    MT_CHECK(mask.dim(0) == input_ids.dim(0) && mask.dim(3) == input_ids.dim(1), "[", model, "] attention_mask ",
             attention_mask.str(), " does not match input_ids ", input_ids.str());
  return mask;
}

Array decoder_self_mask(const Array& decoder_ids, const EncoderOutput& enc, const Array& decoder_attention_mask,
                        int64_t past, const char* model) {
  check_ids(decoder_ids, "decoder_input_ids", model);
  MT_CHECK(enc.hidden.defined() && enc.hidden.ndim() == 3 && enc.hidden.dim(0) == decoder_ids.dim(0), "[", model,
           "] encoder output ", enc.hidden.defined() ? enc.hidden.str() : "undefined",
           " does not match decoder_input_ids ", decoder_ids.str());
  const Array mask = padding_mask(decoder_attention_mask, model);
  if (mask.defined())
    MT_CHECK(mask.dim(3) == past + decoder_ids.dim(1), "[", model, "] decoder_attention_mask ",
             decoder_attention_mask.str(), " must cover ", past + decoder_ids.dim(1), " positions");
  return mask;
}

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
  return shift_right(labels.to_ints(), labels.dim(0), labels.dim(1), decoder_start_token_id, pad_token_id);
}

Array shift_right(const std::vector<int64_t>& labels, int64_t rows, int64_t cols, int64_t decoder_start_token_id,
                  int64_t pad_token_id) {
  MT_CHECK(rows >= 0 && cols >= 0 && int64_t(labels.size()) == rows * cols, "[seq2seq] ", labels.size(),
           " label values for (", rows, ", ", cols, ")");
  std::vector<int64_t> out(labels.size());
  for (int64_t r = 0; r < rows && cols > 0; ++r) {
    out[size_t(r * cols)] = decoder_start_token_id;
    for (int64_t j = 1; j < cols; ++j) {
      const int64_t v = labels[size_t(r * cols + j - 1)];
      out[size_t(r * cols + j)] = v == -100 ? pad_token_id : v;
    }
  }
  return Array::from_vector(out, Shape{rows, cols});
}

}  // namespace mt::models
