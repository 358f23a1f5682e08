#include "meshtrain/backend/strided_copy.h"

#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/core/parallel_grain.h"

namespace mt::cpu {

namespace {
template <class Word>
void copy_rows(const Word* src, const std::vector<int64_t>& ss, Word* dst, const std::vector<int64_t>& ds,
               const std::vector<int64_t>& dims) {
  const int n = int(dims.size());
  int64_t rows = 1;
  for (int i = 0; i + 1 < n; ++i) rows *= dims[size_t(i)];
  const int64_t len = dims.back(), s_in = ss.back(), d_in = ds.back();
#pragma omp parallel for if (rows * len > grain::copy && rows > 1) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t so = 0, dof = 0, rem = r;
    for (int d = n - 2; d >= 0; --d) {
      int64_t idx = rem % dims[size_t(d)];
      rem /= dims[size_t(d)];
      so += idx * ss[size_t(d)];
      dof += idx * ds[size_t(d)];
    }
    const Word* s = src + so;
    Word* t = dst + dof;
    if (s_in == 1 && d_in == 1) {
      std::memcpy(t, s, size_t(len) * sizeof(Word));
    } else {
      for (int64_t i = 0; i < len; ++i) t[i * d_in] = s[i * s_in];
    }
  }
}
}  // namespace

void strided_copy(const void* src, const std::vector<int64_t>& src_strides, void* dst,
                  const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dims, size_t elem_size) {
  // Drop size-1 dims and merge dims that are contiguous in both layouts.
  std::vector<int64_t> d, s, t;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0) return;
    if (dims[i] == 1) continue;
    if (!d.empty() && s.back() == src_strides[i] * dims[i] && t.back() == dst_strides[i] * dims[i]) {
      d.back() *= dims[i];
      s.back() = src_strides[i];
      t.back() = dst_strides[i];
      continue;
    }
    d.push_back(dims[i]);
    s.push_back(src_strides[i]);
    t.push_back(dst_strides[i]);
  }
  if (d.empty()) {
    d = {1};
    s = {1};
    t = {1};
  }
  switch (elem_size) {
    case 1: copy_rows(static_cast<const uint8_t*>(src), s, static_cast<uint8_t*>(dst), t, d); break;
    case 2: copy_rows(static_cast<const uint16_t*>(src), s, static_cast<uint16_t*>(dst), t, d); break;
    case 4: copy_rows(static_cast<const uint32_t*>(src), s, static_cast<uint32_t*>(dst), t, d); break;
    case 8: copy_rows(static_cast<const uint64_t*>(src), s, static_cast<uint64_t*>(dst), t, d); break;
    default: throw Error("[strided_copy] unsupported element size");
  }
}

}  // namespace mt::cpu
