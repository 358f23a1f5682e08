// The seed of cuDNN's dropout mask for a dropout key (cudnn_attention.h), computed on the
// device: the key's last fold is read from device memory when the kernel runs (RngKey::
// fold_last, the Trainer's step number), so a captured step replays this launch as recorded
// and still draws a new mask each step, as the kernels here do.
#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/cudnn_attention.h"
#include "meshtrain/backend/cuda/device_types.cuh"

namespace mt::cuda {

namespace {

__global__ void cudnn_dropout_seed_kernel(uint64_t seed, uint64_t stream_id, const int64_t* fold_last, int64_t* out) {
  uint32_t w[4];
  philox_block(0, seed, stream_of(stream_id, fold_last), w);
  out[0] = int64_t(uint64_t(w[0]) | uint64_t(w[1]) << 32);  // the seed
  out[2] = 0;                                               // the offset, 16 bytes on
}

}  // namespace

void cudnn_dropout_seed(const RngKey& key, Array& seed_offset) {
  MT_CHECK(seed_offset.dtype() == DType::i64 && seed_offset.numel() >= 3, "[cudnn attention] the seed buffer ",
           seed_offset.str(), " is not 3 or more i64");
  cudnn_dropout_seed_kernel<<<1, 1, 0, stream()>>>(key.seed, key.stream, fold_last_address(key),
                                                   mptr<int64_t>(seed_offset));
  check_launch("cudnn dropout seed");
}

}  // namespace mt::cuda
