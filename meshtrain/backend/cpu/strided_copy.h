#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mt::cpu {

// Copies the `dims`-shaped block read with `src_strides` (elements) into the block written
// with `dst_strides`. Transpose, slice, broadcast, pad and concatenate are all this copy.
void strided_copy(const void* src, const std::vector<int64_t>& src_strides, void* dst,
                  const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dims, size_t elem_size);

}  // namespace mt::cpu
