// The one layout kernel (transpose, slice, broadcast, pad, concatenate are all this copy):
// a dims-shaped block read with source strides, written with destination strides.
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/strided_copy.h"

namespace mt::cuda {

namespace {

// I: the index type; 32-bit when every offset fits (its divisions are several times cheaper).
template <class W, class I>
__global__ void strided_copy_kernel(const W* src, W* dst, I n, Strided s) {
  I dims[kMaxDims], ss[kMaxDims], ds[kMaxDims];
  for (int d = 0; d < s.ndim; ++d) dims[d] = I(s.dims[d]), ss[d] = I(s.strides[0][d]), ds[d] = I(s.strides[1][d]);
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I rem = i, so = 0, d_off = 0;
    for (int d = s.ndim - 1; d >= 0; --d) {
      const I c = rem % dims[d];
      rem /= dims[d];
      so += c * ss[d];
      d_off += c * ds[d];
    }
    dst[d_off] = src[so];
  }
}

bool row_major(const std::vector<int64_t>& strides, const std::vector<int64_t>& dims) {
  int64_t expect = 1;
  for (size_t d = dims.size(); d-- > 0;) {
    if (dims[d] != 1 && strides[d] != expect) return false;
    expect *= dims[d];
  }
  return true;
}

}  // namespace

void strided_copy(const void* src, const std::vector<int64_t>& src_strides, void* dst,
                  const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dims, size_t elem_size) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  if (n == 0) return;
  if (row_major(src_strides, dims) && row_major(dst_strides, dims)) {
    check(cudaMemcpyAsync(dst, src, size_t(n) * elem_size, cudaMemcpyDeviceToDevice, stream()), "strided copy");
    return;
  }
  // Drop size-1 dims (their strides never matter) and merge dims contiguous in both layouts.
  Strided s;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;
    if (s.ndim > 0 && s.strides[0][s.ndim - 1] == src_strides[d] * dims[d] &&
        s.strides[1][s.ndim - 1] == dst_strides[d] * dims[d]) {
      s.dims[s.ndim - 1] *= dims[d];
      s.strides[0][s.ndim - 1] = src_strides[d];
      s.strides[1][s.ndim - 1] = dst_strides[d];
      continue;
    }
    MT_CHECK(s.ndim < kMaxDims, "[strided_copy] more than ", kMaxDims, " dims on the GPU");
    s.dims[s.ndim] = dims[d];
    s.strides[0][s.ndim] = src_strides[d];
    s.strides[1][s.ndim] = dst_strides[d];
    ++s.ndim;
  }
  // Innermost dim contiguous on both sides: move 16- (or 8-) byte words of several elements,
  // as many as divide that dim, every outer stride and both addresses. A head transpose of
  // (B, T, H, 64) f32 then moves 16 words per 256-byte row instead of 64 elements.
  size_t word = elem_size;
  if (s.ndim > 0 && s.strides[0][s.ndim - 1] == 1 && s.strides[1][s.ndim - 1] == 1) {
    for (size_t w : {size_t(16), size_t(8)}) {
      if (w <= elem_size) break;
      const int64_t f = int64_t(w / elem_size);
      bool ok = s.dims[s.ndim - 1] % f == 0 && reinterpret_cast<uintptr_t>(src) % w == 0 &&
                reinterpret_cast<uintptr_t>(dst) % w == 0;
      for (int d = 0; d + 1 < s.ndim; ++d) ok = ok && s.strides[0][d] % f == 0 && s.strides[1][d] % f == 0;
      if (!ok) continue;
      word = w;
      s.dims[s.ndim - 1] /= f;
      for (int d = 0; d + 1 < s.ndim; ++d) s.strides[0][d] /= f, s.strides[1][d] /= f;
      n /= f;
      break;
    }
  }
  // Every offset either side reaches is below the span of its strides.
  int64_t span_src = 1, span_dst = 1;
  for (int d = 0; d < s.ndim; ++d) {
    span_src += (s.dims[d] - 1) * s.strides[0][d];
    span_dst += (s.dims[d] - 1) * s.strides[1][d];
  }
  const bool fits_32 = n < (int64_t(1) << 31) && span_src < (int64_t(1) << 31) && span_dst < (int64_t(1) << 31);
  auto launch = [&](auto tag) {
    using W = decltype(tag);
    if (fits_32)
      strided_copy_kernel<W, uint32_t><<<blocks_for(n), kThreads, 0, stream()>>>(
          static_cast<const W*>(src), static_cast<W*>(dst), uint32_t(n), s);
    else
      strided_copy_kernel<W, int64_t><<<blocks_for(n), kThreads, 0, stream()>>>(static_cast<const W*>(src),
                                                                                 static_cast<W*>(dst), n, s);
  };
  switch (word) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    case 8: launch(uint64_t{}); break;
    case 16: launch(uint4{}); break;
    default: throw Error(detail::concat("[strided_copy] unsupported element size ", elem_size));
  }
  check_launch("strided_copy");
}

}  // namespace mt::cuda
