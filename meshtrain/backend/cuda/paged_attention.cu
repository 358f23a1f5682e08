// Decode attention over a paged KV cache on the GPU (cpu/paged_attention_kernel is the
// reference): one thread block per (row, query head) — scores in shared memory, the softmax
// in the CPU's order (max, double sum, one reciprocal; expf where the CPU has its fast_exp,
// so results agree to rounding), then one thread per channel sums
// the probability-weighted values. Block tables, lengths and slots come from the host per
// call (a few hundred integers).
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/paged_attention.h"

#include <algorithm>

namespace mt::cuda {

namespace {

constexpr int kRowThreads = 128;

template <class T>
__global__ void write_kernel(T* pool, const T* kv, const int64_t* slots, int64_t n, int64_t heads, int64_t t,
                             int64_t d, int64_t block) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % d, j = (e / d) % t, h = (e / (d * t)) % heads, i = e / (d * t * heads);
    const int64_t slot = slots[i * t + j];
    pool[(((slot / block) * heads + h) * block + slot % block) * d + c] = kv[e];
  }
}

template <class T>
__global__ void attend_kernel(const T* q, const T* k_pool, const T* v_pool, const int64_t* table, int64_t max_blocks,
                              const int64_t* lengths, int64_t heads, int64_t kv_heads, int64_t block, int d,
                              float scale, T* out) {
  extern __shared__ float scores[];
  __shared__ float fshared[32];
  __shared__ double dshared[32];
  const int64_t bh = blockIdx.x, i = bh / heads, kv_head = (bh % heads) / (heads / kv_heads);
  const int64_t length = lengths[i];
  const int64_t* row_table = table + i * max_blocks;
  const T* qr = q + bh * d;
  auto position = [&](int64_t j) { return ((row_table[j / block] * kv_heads + kv_head) * block + j % block) * d; };
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    const T* k = k_pool + position(j);
    float s = 0;
    for (int c = 0; c < d; ++c) s += to_f32(qr[c]) * to_f32(k[c]);
    scores[j] = s * scale;
    m = fmaxf(m, scores[j]);
  }
  m = block_max(m, fshared);
  double sum = 0;
  for (int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    scores[j] = expf(scores[j] - m);
    sum += scores[j];
  }
  const float inv = float(1.0 / block_sum(sum, dshared));
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j < length; ++j) acc += scores[j] * inv * to_f32(v_pool[position(j) + c]);
    out[bh * d + c] = from_f32<T>(acc);
  }
}

Array ints_on(const std::vector<int64_t>& values, const Device& device) {
  return Array::from_vector(values, Shape{int64_t(values.size())}).to(device);
}

}  // namespace

void paged_kv_write(Array& pool, const Array& kv, const std::vector<int64_t>& slots) {
  const int64_t n = kv.numel();
  if (n == 0) return;
  const Array s = ints_on(slots, kv.device());
  dispatch_device_float(kv.dtype(), "paged_kv_write", [&](auto tag) {
    using T = decltype(tag);
    write_kernel<T><<<blocks_for(n), kThreads, 0, stream()>>>(mptr<T>(pool), ptr<T>(kv), s.data<int64_t>(), n,
                                                              kv.dim(1), kv.dim(2), kv.dim(3), pool.dim(2));
    check_launch("paged_kv_write");
  });
}

void paged_attention(const Array& q, const Array& k_pool, const Array& v_pool, const kernels::PagedRows& rows,
                     float scale, Array& out) {
  int64_t longest = 1;
  for (int64_t len : rows.lengths) longest = std::max(longest, len);
  const size_t shared = size_t(longest) * sizeof(float);
  int device = 0, bound = 0;
  check(cudaGetDevice(&device), "paged_attention");
  check(cudaDeviceGetAttribute(&bound, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "paged_attention");
  bound -= 1024;  // the kernel's static reduction buffers
  MT_CHECK(shared <= size_t(bound), "[paged_attention] ", longest, " positions exceed this GPU kernel's bound of ",
           bound / 4, " (one f32 score per position in shared memory)");
  const Array table = ints_on(rows.block_table, q.device()), lengths = ints_on(rows.lengths, q.device());
  dispatch_device_float(q.dtype(), "paged_attention", [&](auto tag) {
    using T = decltype(tag);
    check(cudaFuncSetAttribute(attend_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)),
          "paged_attention");
    attend_kernel<T><<<unsigned(q.dim(0) * q.dim(1)), kRowThreads, shared, stream()>>>(
        ptr<T>(q), ptr<T>(k_pool), ptr<T>(v_pool), table.data<int64_t>(), rows.max_blocks, lengths.data<int64_t>(),
        q.dim(1), k_pool.dim(1), k_pool.dim(2), int(q.dim(3)), scale, mptr<T>(out));
    check_launch("paged_attention");
  });
}

}  // namespace mt::cuda
