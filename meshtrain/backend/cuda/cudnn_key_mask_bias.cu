// A key-padding mask as the additive bias cuDNN's attention graphs take (cudnn_attention.h), and
// the batches whose mask row unmasks no key, which the bias cannot serve: the tensor-core
// kernels run those (FlashAttentionShape's convention gives such a row uniform weights; with
// the bias its scores round to one value too, but its log-sum-exp loses log(Tk), so the
// backward's probabilities would come out as 1 instead of 1 / Tk).
#include <cuda_bf16.h>

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/cudnn_attention.h"

namespace mt::cuda {

namespace {

// Block (b, y): batch b's mask row (row 0 for every batch when the mask has one row), into rows
// y, y + gridDim.y, ... of its bias. Blocks of rows the bias holds write them; the first block
// of each batch writes its flag.
__global__ void key_mask_bias_kernel(const bool* mask, int64_t mask_batches, int64_t tk, int64_t rows,
                                     __nv_bfloat16* bias, int32_t* no_visible_key) {
  const int64_t b = blockIdx.x, row = mask_batches == 1 ? 0 : b;
  const bool* m = mask + row * tk;
  const bool writes_bias = b < mask_batches;
  // kMaskedScore, bf16's lowest finite value: any score plus it rounds to it in f32.
  const __nv_bfloat16 lowest = __ushort_as_bfloat16(0xFF7F), zero = __ushort_as_bfloat16(0);
  int any = 0;
  for (int64_t j = threadIdx.x; j < tk; j += blockDim.x) {
    const bool visible = m[j];
    any |= visible ? 1 : 0;
    if (writes_bias)
      for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) bias[(row * rows + r) * tk + j] = visible ? zero : lowest;
  }
  any = __syncthreads_or(any);
  if (threadIdx.x == 0 && blockIdx.y == 0) no_visible_key[b] = any ? 0 : 1;
}

}  // namespace

void cudnn_key_mask_bias(const bool* key_mask, int64_t mask_batches, int64_t tk, int64_t rows, Array& bias,
                         Array& no_visible_key) {
  MT_CHECK(key_mask != nullptr && mask_batches >= 1 && tk >= 1 && rows >= 1,
           "[cudnn attention] no key mask to make a bias of");
  MT_CHECK(bias.dtype() == DType::bf16 && bias.numel() == mask_batches * rows * tk, "[cudnn attention] the bias ",
           bias.str(), " is not (", mask_batches, ", ", rows, ", ", tk, ") bf16");
  MT_CHECK(no_visible_key.dtype() == DType::i32 && no_visible_key.numel() >= mask_batches,
           "[cudnn attention] the flags ", no_visible_key.str(), " hold fewer than ", mask_batches, " i32");
  const dim3 grid(unsigned(no_visible_key.numel()), unsigned(rows < 64 ? rows : 64));
  key_mask_bias_kernel<<<grid, kThreads, 0, stream()>>>(key_mask, mask_batches, tk, rows, mptr<__nv_bfloat16>(bias),
                                                        mptr<int32_t>(no_visible_key));
  check_launch("cudnn key mask bias");
}

}  // namespace mt::cuda
