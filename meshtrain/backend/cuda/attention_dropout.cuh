#pragma once
// The dropout mask of the fused attention kernels (attention.cu, attention_tensor_core.cu):
// the same Philox elements dropout() draws on the (BH, Tq, Tk) probabilities, so fused and
// composed attention drop the same entries for one key.
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/random.h"

namespace mt::cuda {

struct AttentionDropout {
  uint32_t keep_from;  // kernels::keep_steps(rate)
  float scale;         // a kept probability's factor: 1 / (1 - rate), 1 without dropout
  uint64_t seed, stream_id;
  bool on;
  const int64_t* fold_last;  // the key's last fold, in device memory (null: none)
};

// Folds the key's last value into the stream: each kernel once per thread, before drawing.
__device__ inline void fold_last_in(AttentionDropout& dr) {
  dr.stream_id = stream_of(dr.stream_id, dr.fold_last);
  dr.fold_last = nullptr;
}

__device__ inline float keep_from_word(const AttentionDropout& dr, uint32_t word) {
  return keeps_word(word, dr.keep_from) ? dr.scale : 0.0f;
}

// The keep factor (0 or 1 / (1 - rate)) of element idx of the (BH, Tq, Tk) array.
__device__ inline float keep_factor(const AttentionDropout& dr, int64_t idx) {
  return dr.on ? keep_from_word(dr, philox_element(uint64_t(idx), dr.seed, dr.stream_id)) : 1.0f;
}

inline AttentionDropout attention_dropout(double rate, const RngKey& key) {
  const float scale = !(rate > 0) ? 1.0f : rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f;
  return {kernels::keep_steps(rate), scale, key.seed, key.stream, rate > 0,
          rate > 0 ? fold_last_address(key) : nullptr};
}

}  // namespace mt::cuda
