// Fused (flash-style) attention, forward and backward, one thread per query (or key) row, for
// what the tensor-core kernels (attention_tensor_core.cu) do not take (f16 arrays, GPUs
// before sm_80; no key-padding masks, which flash_attention's infer() refuses here):
// scores, online softmax and the dropout mask live in registers and shared memory; the
// (Tq, Tk) probabilities are never stored — the backward recomputes them from the saved row
// log-sum-exps. f32 arithmetic for every dtype. The CPU kernel (cpu/attention_kernel) is the
// reference; dropout draws the same Philox elements as dropout() on the (BH, Tq, Tk) array.
#include "meshtrain/backend/cuda/cudnn_attention.h"
#include "meshtrain/backend/cuda/attention_dropout.cuh"
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/attention.h"

namespace mt::cuda {

namespace {

constexpr int kTile = 32;  // rows per block and keys (queries) per shared-memory tile

// The keys a block of query rows reads (`end`: through the last row's causal limit) and the
// keys row i sees (`visible`; 0 for an inactive thread).
struct KeyRange {
  int64_t end, visible;
};
__device__ inline KeyRange key_range(int64_t tq, int64_t tk, bool causal, int64_t i, bool active) {
  const int64_t offset = tk - tq, last_row = min(tq - 1, int64_t(blockIdx.y) * kTile + kTile - 1);
  return {causal ? min(tk, last_row + offset + 1) : tk, active ? (causal ? min(tk, i + offset + 1) : tk) : 0};
}

// Rows j0 .. j0 + kTile of a (T, d) pair of arrays starting at row `base` into f32 tiles
// (zeros past T and past d).
template <int MaxD, class T>
__device__ inline void load_tile(float (*a)[MaxD], float (*b)[MaxD], const T* x, const T* y, int64_t base, int64_t t,
                                 int64_t j0, int d) {
  for (int e = threadIdx.x; e < kTile * MaxD; e += blockDim.x) {
    const int r = e / MaxD, c = e % MaxD;
    const int64_t j = j0 + r;
    const bool in = j < t && c < d;
    a[r][c] = in ? to_f32(x[(base + j) * d + c]) : 0.0f;
    b[r][c] = in ? to_f32(y[(base + j) * d + c]) : 0.0f;
  }
}

// Block: (batch·head, query tile); thread: one query row. MaxD: head dim bound (d <= MaxD).
// Query head bh reads key/value slice bh / group.
template <class T, int MaxD>
__global__ void forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, int64_t tq, int64_t tk, int d,
                               float scale, bool causal, AttentionDropout dr, int64_t group) {
  fold_last_in(dr);
  __shared__ float ks[kTile][MaxD], vs[kTile][MaxD];
  const int64_t bh = blockIdx.x, i = int64_t(blockIdx.y) * kTile + threadIdx.x;
  const bool active = i < tq;
  float qr[MaxD], o[MaxD];
#pragma unroll
  for (int c = 0; c < MaxD; ++c) {
    qr[c] = active && c < d ? to_f32(q[(bh * tq + i) * d + c]) : 0.0f;
    o[c] = 0.0f;
  }
  const KeyRange keys = key_range(tq, tk, causal, i, active);
  float m = -INFINITY, l = 0.0f;
  for (int64_t j0 = 0; j0 < keys.end; j0 += kTile) {
    __syncthreads();
    load_tile<MaxD>(ks, vs, k, v, bh / group * tk, tk, j0, d);
    __syncthreads();
    if (j0 >= keys.visible) continue;
    float s[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < MaxD; ++c) acc += qr[c] * ks[r][c];
      s[r] = j0 + r < keys.visible ? acc * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[r]);
    }
    const float m_new = fmaxf(m, tile_max);
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l *= alpha;
#pragma unroll
    for (int c = 0; c < MaxD; ++c) o[c] *= alpha;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      if (j0 + r >= keys.visible) continue;
      const float p = expf(s[r] - m_new);
      l += p;
      const float pd = p * keep_factor(dr, (bh * tq + i) * tk + j0 + r);
      if (pd == 0.0f) continue;
#pragma unroll
      for (int c = 0; c < MaxD; ++c) o[c] += pd * vs[r][c];
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no keys at all (Tk = 0): zeros, as the CPU
  for (int c = 0; c < d; ++c) out[(bh * tq + i) * d + c] = from_f32<T>(o[c] * inv);
  lse[bh * tq + i] = m + logf(l);
}

// D_i = dO_i · O_i, one thread per row.
template <class T>
__global__ void row_dot_kernel(const T* g, const T* out, float* dvec, int64_t rows, int d) {
  MT_GRID_LOOP(r, rows) {
    float acc = 0.0f;
    for (int c = 0; c < d; ++c) acc += to_f32(g[r * d + c]) * to_f32(out[r * d + c]);
    dvec[r] = acc;
  }
}

// dK, dV. Block: (key/value slice, key tile); thread: one key row, looping over the query
// tiles of each query head of the slice's group that can see it.
template <class T, int MaxD>
__global__ void backward_kv_kernel(const T* q, const T* k, const T* v, const T* g, const float* lse, const float* dvec,
                                   T* dk, T* dv, int64_t tq, int64_t tk, int d, float scale, bool causal,
                                   AttentionDropout dr, int64_t group) {
  fold_last_in(dr);
  __shared__ float kself[kTile][MaxD + 1], vself[kTile][MaxD + 1];
  __shared__ float qs[kTile][MaxD], gs[kTile][MaxD], ls[kTile], ds_[kTile];
  const int64_t kv = blockIdx.x, j = int64_t(blockIdx.y) * kTile + threadIdx.x, offset = tk - tq;
  const bool active = j < tk;
  for (int c = 0; c < MaxD; ++c) {
    kself[threadIdx.x][c] = active && c < d ? to_f32(k[(kv * tk + j) * d + c]) : 0.0f;
    vself[threadIdx.x][c] = active && c < d ? to_f32(v[(kv * tk + j) * d + c]) : 0.0f;
  }
  float dkr[MaxD], dvr[MaxD];
#pragma unroll
  for (int c = 0; c < MaxD; ++c) dkr[c] = dvr[c] = 0.0f;
  const int64_t first_key = int64_t(blockIdx.y) * kTile;
  // Query i sees key j when i >= j - offset.
  const int64_t first_query = causal ? max(int64_t(0), first_key - offset) : 0;
  for (int64_t bh = kv * group; bh < (kv + 1) * group; ++bh) {
    for (int64_t i0 = first_query / kTile * kTile; i0 < tq; i0 += kTile) {
      __syncthreads();
      load_tile<MaxD>(qs, gs, q, g, bh * tq, tq, i0, d);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        ls[r] = i0 + r < tq ? lse[bh * tq + i0 + r] : 0.0f;
        ds_[r] = i0 + r < tq ? dvec[bh * tq + i0 + r] : 0.0f;
      }
      __syncthreads();
      if (!active) continue;
      for (int r = 0; r < kTile; ++r) {
        const int64_t i = i0 + r;
        if (i >= tq) break;
        if (causal && j > i + offset) continue;
        float sc = 0.0f, dp = 0.0f;
#pragma unroll
        for (int c = 0; c < MaxD; ++c) {
          sc += qs[r][c] * kself[threadIdx.x][c];
          dp += gs[r][c] * vself[threadIdx.x][c];
        }
        const float p = expf(sc * scale - ls[r]);
        const float keep = keep_factor(dr, (bh * tq + i) * tk + j);
        const float dsc = p * (keep * dp - ds_[r]) * scale;
        const float pk = p * keep;
#pragma unroll
        for (int c = 0; c < MaxD; ++c) {
          dvr[c] += pk * gs[r][c];
          dkr[c] += dsc * qs[r][c];
        }
      }
    }
  }
  if (!active) return;
  for (int c = 0; c < d; ++c) {
    dk[(kv * tk + j) * d + c] = from_f32<T>(dkr[c]);
    dv[(kv * tk + j) * d + c] = from_f32<T>(dvr[c]);
  }
}

// dQ. Block: (batch·head, query tile); thread: one query row, looping over visible key tiles
// of its key/value slice bh / group.
template <class T, int MaxD>
__global__ void backward_q_kernel(const T* q, const T* k, const T* v, const T* g, const float* lse, const float* dvec,
                                  T* dq, int64_t tq, int64_t tk, int d, float scale, bool causal,
                                  AttentionDropout dr, int64_t group) {
  fold_last_in(dr);
  __shared__ float qself[kTile][MaxD + 1], gself[kTile][MaxD + 1];
  __shared__ float ks[kTile][MaxD], vs[kTile][MaxD];
  const int64_t bh = blockIdx.x, i = int64_t(blockIdx.y) * kTile + threadIdx.x;
  const bool active = i < tq;
  for (int c = 0; c < MaxD; ++c) {
    qself[threadIdx.x][c] = active && c < d ? to_f32(q[(bh * tq + i) * d + c]) : 0.0f;
    gself[threadIdx.x][c] = active && c < d ? to_f32(g[(bh * tq + i) * d + c]) : 0.0f;
  }
  const float row_lse = active ? lse[bh * tq + i] : 0.0f, row_d = active ? dvec[bh * tq + i] : 0.0f;
  float dqr[MaxD];
#pragma unroll
  for (int c = 0; c < MaxD; ++c) dqr[c] = 0.0f;
  const KeyRange keys = key_range(tq, tk, causal, i, active);
  for (int64_t j0 = 0; j0 < keys.end; j0 += kTile) {
    __syncthreads();
    load_tile<MaxD>(ks, vs, k, v, bh / group * tk, tk, j0, d);
    __syncthreads();
    for (int r = 0; r < kTile; ++r) {
      const int64_t j = j0 + r;
      if (j >= keys.visible) break;
      float sc = 0.0f, dp = 0.0f;
#pragma unroll
      for (int c = 0; c < MaxD; ++c) {
        sc += qself[threadIdx.x][c] * ks[r][c];
        dp += gself[threadIdx.x][c] * vs[r][c];
      }
      const float p = expf(sc * scale - row_lse);
      const float keep = keep_factor(dr, (bh * tq + i) * tk + j);
      const float dsc = p * (keep * dp - row_d) * scale;
#pragma unroll
      for (int c = 0; c < MaxD; ++c) dqr[c] += dsc * ks[r][c];
    }
  }
  if (!active) return;
  for (int c = 0; c < d; ++c) dq[(bh * tq + i) * d + c] = from_f32<T>(dqr[c]);
}

AttentionDropout dropout_of(const kernels::FlashAttentionShape& s) {
  return attention_dropout(s.dropout_rate, s.dropout_key);
}

template <class F>
void dispatch_head_dim(int64_t d, F&& f) {
  if (d <= 32) f(std::integral_constant<int, 32>{});
  else if (d <= 64) f(std::integral_constant<int, 64>{});
  else throw Error(detail::concat("[flash_attention] head dim ", d, " > 64 is not supported on the GPU"));
}

}  // namespace

bool flash_attention_supported(const Array& q, int64_t head_dim) {
  return flash_attention_tensor_cores(q, head_dim) || (head_dim > 0 && head_dim <= 64);
}

void flash_attention_forward(const Array& q, const Array& k, const Array& v, const kernels::FlashAttentionShape& s,
                             Array& out, Array& lse) {
  if (s.batch_heads * s.tq == 0) return;
  // cuDNN's fused engine where asked for and it takes the arrays (cudnn_attention.h); its
  // log-sum-exp is the one the backward kernels below read, and the one it reads.
  if (cudnn_attention_forward(q, k, v, s, out, lse)) return;
  if (flash_attention_tensor_cores(q, s.d)) return flash_attention_forward_tc(q, k, v, s, out, lse);
  MT_CHECK(!s.heads_inner, "[flash_attention] heads-inner (B, T, H, D) arrays need the tensor-core kernels, which do "
           "not take ", q.str());
  const dim3 grid(unsigned(s.batch_heads), unsigned((s.tq + kTile - 1) / kTile));
  dispatch_device_float(q.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(s.d, [&](auto md) {
      forward_kernel<T, decltype(md)::value><<<grid, kTile, 0, stream()>>>(
          ptr<T>(q), ptr<T>(k), ptr<T>(v), mptr<T>(out), mptr<float>(lse), s.tq, s.tk, int(s.d), s.scale, s.causal,
          dropout_of(s), s.group);
    });
  });
  check_launch("flash_attention");
}

void flash_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const kernels::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  if (s.batch_heads * s.tq == 0 || s.tk == 0) {  // nothing attends: zero gradients, as the CPU
    for (Array* a : {&dq, &dk, &dv})
      if (a->nbytes() > 0) check(cudaMemsetAsync(a->raw(), 0, a->nbytes(), stream()), "flash_attention_backward");
    return;
  }
  if (cudnn_attention_backward(q, k, v, out, lse, g, s, dq, dk, dv)) return;
  if (flash_attention_tensor_cores(q, s.d)) return flash_attention_backward_tc(q, k, v, out, lse, g, s, dq, dk, dv);
  MT_CHECK(!s.heads_inner, "[flash_attention_backward] heads-inner (B, T, H, D) arrays need the tensor-core kernels, "
           "which do not take ", q.str());
  Array dvec = Array::empty({s.batch_heads * s.tq}, DType::f32, q.device());
  dispatch_device_float(q.dtype(), "flash_attention", [&](auto tag) {
    using T = decltype(tag);
    row_dot_kernel<<<blocks_for(s.batch_heads * s.tq), kThreads, 0, stream()>>>(ptr<T>(g), ptr<T>(out),
                                                                                mptr<float>(dvec), s.batch_heads * s.tq,
                                                                                int(s.d));
    dispatch_head_dim(s.d, [&](auto md) {
      constexpr int MaxD = decltype(md)::value;
      const dim3 kv_grid(unsigned(s.batch_heads / s.group), unsigned((s.tk + kTile - 1) / kTile));
      backward_kv_kernel<T, MaxD><<<kv_grid, kTile, 0, stream()>>>(
          ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(g), ptr<float>(lse), ptr<float>(dvec), mptr<T>(dk), mptr<T>(dv), s.tq,
          s.tk, int(s.d), s.scale, s.causal, dropout_of(s), s.group);
      const dim3 q_grid(unsigned(s.batch_heads), unsigned((s.tq + kTile - 1) / kTile));
      backward_q_kernel<T, MaxD><<<q_grid, kTile, 0, stream()>>>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(g),
                                                                ptr<float>(lse), ptr<float>(dvec), mptr<T>(dq), s.tq,
                                                                s.tk, int(s.d), s.scale, s.causal, dropout_of(s),
                                                                s.group);
    });
  });
  check_launch("flash_attention_backward");
}

}  // namespace mt::cuda
