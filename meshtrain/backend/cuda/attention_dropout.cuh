#pragma once
// The dropout mask of the fused attention kernels (attention.cu, attention_tensor_core.cu):
// the same Philox elements dropout() draws on the (BH, Tq, Tk) probabilities, so fused and
// composed attention drop the same entries for one key.
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/random.h"

namespace mt::cuda {

struct AttentionDropout {
  uint32_t keep_from;  // kernels::keep_steps(rate)
  float scale;         // 1 / (1 - rate)
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
  if (!dr.on) return 1.0f;
  uint32_t w[4];
  philox_block(uint64_t(idx) / 4, dr.seed, dr.stream_id, w);
  return keep_from_word(dr, w[uint64_t(idx) % 4]);
}

// Elements idx .. idx + 3: one Philox block when idx starts one (each element draws word
// idx % 4 of block idx / 4).
__device__ inline void keep_factors4(const AttentionDropout& dr, int64_t idx, float (&keep)[4]) {
  if (!dr.on) {
    keep[0] = keep[1] = keep[2] = keep[3] = 1.0f;
  } else if (idx % 4 == 0) {
    uint32_t w[4];
    philox_block(uint64_t(idx) / 4, dr.seed, dr.stream_id, w);
#pragma unroll
    for (int u = 0; u < 4; ++u) keep[u] = keep_from_word(dr, w[u]);
  } else {
#pragma unroll
    for (int u = 0; u < 4; ++u) keep[u] = keep_factor(dr, idx + u);
  }
}

inline AttentionDropout attention_dropout(double rate, const RngKey& key) {
  return {kernels::keep_steps(rate), rate < 1.0 ? float(1.0 / (1.0 - rate)) : 0.0f, key.seed, key.stream, rate > 0,
          rate > 0 ? fold_last_address(key) : nullptr};
}

}  // namespace mt::cuda
