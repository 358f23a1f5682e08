#pragma once
// The layout kernel: cpu/strided_copy.cpp and cuda/strided_copy.cu. Copies the `dims`-shaped
// block read with `src_strides` (elements) into the block written with `dst_strides`.
// Transpose, slice, broadcast, pad and concatenate are all this copy.
#include <cstddef>
#include <cstdint>
#include <vector>

#define MT_STRIDED_COPY_KERNELS                                                                       \
  void strided_copy(const void* src, const std::vector<int64_t>& src_strides, void* dst,            \
                    const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dims, \
                    size_t elem_size);

namespace mt::cpu { MT_STRIDED_COPY_KERNELS }
namespace mt::cuda { MT_STRIDED_COPY_KERNELS }
