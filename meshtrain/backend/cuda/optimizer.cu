// Adam/AdamW updates in two passes, with the CPU kernel's order of operations (this file is
// compiled without FMA contraction, as cpu/optimizer.cpp is, so both round alike). The step
// size, bias correction and decay are loaded from the step's scalars buffer, not passed by
// value: the launches of one step equal the next step's, so a CUDA graph can replay them.
#include "meshtrain/backend/cuda/device_types.cuh"
#include "meshtrain/backend/optimizer.h"

namespace mt::cuda {

namespace {

__global__ void adam_moments_kernel(const float* g, const float* m, const float* v, kernels::AdamHyper k, float* mo,
                                    float* vo, int64_t n) {
  MT_GRID_LOOP(i, n) {
    const float gi = g[i];
    mo[i] = m[i] * k.b1 + gi * k.one_minus_b1;
    vo[i] = v[i] * k.b2 + (gi * gi) * k.one_minus_b2;
  }
}

__global__ void adam_direction_kernel(const float* m, const float* v, const float* p, kernels::AdamHyper k,
                                      const float* scalars, float* out, int64_t n) {
  const float neg_step = -scalars[kernels::kAdamStepSize], sqrt_bc2 = scalars[kernels::kAdamSqrtBc2],
              decay = scalars[kernels::kAdamDecay];
  MT_GRID_LOOP(i, n) {
    float u = (m[i] / (sqrtf(v[i]) / sqrt_bc2 + k.eps)) * neg_step;
    if (p) u = u - p[i] * decay;
    out[i] = u;
  }
}

// Multi-tensor launches: a table of up to kSlices tensors rides in the kernel's parameters
// (56 bytes each, well under the 4 KiB limit); each block takes kTile elements of one tensor.
constexpr int kSlices = 48;
constexpr int kTile = 4096;

struct Slice {
  const float* a;  // g (moments) or m (direction)
  const float* b;  // m or v
  const float* c;  // v or p (nullptr: no decay)
  float* out;      // the direction's output for this tensor (unused by the moments)
  int64_t n, offset;  // offset: the tensor's start in the moments' flat rows
  int first_block;  // blocks before this tensor's in the launch
};
struct SliceTable {
  Slice s[kSlices];
  int count;
};

// The slice of a table (SliceTable, ClipTable) this block works on.
template <class Table>
__device__ const auto& slice_of_block(const Table& t) {
  int j = 0;
  while (j + 1 < t.count && t.s[j + 1].first_block <= int(blockIdx.x)) ++j;
  return t.s[j];
}

__global__ void adam_moments_multi_kernel(const __grid_constant__ SliceTable t, kernels::AdamHyper k, float* mo,
                                          float* vo) {
  const Slice& s = slice_of_block(t);
  const int64_t start = int64_t(int(blockIdx.x) - s.first_block) * kTile;
  const int64_t end = min(s.n, start + kTile);
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = s.a[i];
    mo[s.offset + i] = s.b[i] * k.b1 + gi * k.one_minus_b1;
    vo[s.offset + i] = s.c[i] * k.b2 + (gi * gi) * k.one_minus_b2;
  }
}

__global__ void adam_direction_multi_kernel(const __grid_constant__ SliceTable t, kernels::AdamHyper k,
                                            const float* scalars) {
  const Slice& s = slice_of_block(t);
  const int64_t start = int64_t(int(blockIdx.x) - s.first_block) * kTile;
  const int64_t end = min(s.n, start + kTile);
  const float neg_step = -scalars[kernels::kAdamStepSize], sqrt_bc2 = scalars[kernels::kAdamSqrtBc2],
              decay = scalars[kernels::kAdamDecay];
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    float u = (s.a[i] / (sqrtf(s.b[i]) / sqrt_bc2 + k.eps)) * neg_step;
    if (s.c) u = u - s.c[i] * decay;
    s.out[i] = u;
  }
}

// Launches `kernel` over the k tensors of `in` (three operand groups a, b, c) in tables of
// kSlices; c_of(j) is tensor j's third operand or nullptr, out_of(j) its output or nullptr.
template <class Launch, class COf, class OutOf>
void launch_tables(const std::vector<Array>& in, COf c_of, OutOf out_of, Launch launch) {
  const size_t k = in.size() / 3;
  SliceTable t{};
  int blocks = 0;
  int64_t offset = 0;
  auto flush = [&] {
    if (t.count > 0 && blocks > 0) launch(t, blocks);
    t = SliceTable{};
    blocks = 0;
  };
  for (size_t j = 0; j < k; ++j) {
    const int64_t n = in[j].numel();
    if (n > 0) {
      const int64_t tensor_blocks = (n + kTile - 1) / kTile;
      if (t.count == kSlices || int64_t(blocks) + tensor_blocks > (int64_t(1) << 30)) flush();
      t.s[t.count++] = {ptr<float>(in[j]), ptr<float>(in[k + j]), c_of(j), out_of(j), n, offset, blocks};
      blocks += int(tensor_blocks);
    }
    offset += n;
  }
  flush();
}

}  // namespace

void adam_moments_multi(const std::vector<Array>& in, const kernels::AdamHyper& h, Array& out) {
  const size_t k = in.size() / 3;
  float* mo = mptr<float>(out);
  float* vo = mo + out.numel() / 2;
  launch_tables(
      in, [&](size_t j) { return ptr<float>(in[2 * k + j]); }, [](size_t) -> float* { return nullptr; },
      [&](const SliceTable& t, int blocks) {
        adam_moments_multi_kernel<<<unsigned(blocks), kThreads, 0, stream()>>>(t, h, mo, vo);
        check_launch("adam_moments_multi");
      });
}

void adam_direction_multi(const std::vector<Array>& in, const std::vector<uint8_t>& decays, const kernels::AdamHyper& h,
                          const Array& scalars, std::vector<Array>& outs) {
  const size_t k = in.size() / 3;
  const float* s = ptr<float>(scalars);
  launch_tables(
      in, [&](size_t j) { return decays[j] ? ptr<float>(in[2 * k + j]) : nullptr; },
      [&](size_t j) { return mptr<float>(outs[j]); },
      [&](const SliceTable& t, int blocks) {
        adam_direction_multi_kernel<<<unsigned(blocks), kThreads, 0, stream()>>>(t, h, s);
        check_launch("adam_direction_multi");
      });
}

void adam_moments(const Array& g, const Array& m, const Array& v, const kernels::AdamHyper& h, Array& out) {
  const int64_t n = g.numel();
  if (n == 0) return;
  float* mo = mptr<float>(out);
  adam_moments_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ptr<float>(g), ptr<float>(m), ptr<float>(v), h, mo,
                                                                mo + n, n);
  check_launch("adam_moments");
}

void adam_direction(const Array& m, const Array& v, const Array* p, const kernels::AdamHyper& h, const Array& scalars,
                    Array& out) {
  const int64_t n = m.numel();
  if (n == 0) return;
  adam_direction_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(
      ptr<float>(m), ptr<float>(v), p ? ptr<float>(*p) : nullptr, h, ptr<float>(scalars), mptr<float>(out), n);
  check_launch("adam_direction");
}

namespace {

// The tables of the clipping and update kernels: one tensor per slice, each block taking kTile
// elements of one. A slice is 40 bytes, so a table of kClipSlices stays under the 4 KiB of
// launch parameters.
constexpr int kClipSlices = 96;
static_assert(kTile == kernels::kSumSquaresTile, "the GPU's tiles are the CPU's");

struct ClipSlice {
  const void* x;
  const void* z;  // add_multi's second operand
  void* y;        // scale_multi's and add_multi's output (unused by the sums)
  int64_t n;
  int first_block;
};
struct ClipTable {
  ClipSlice s[kClipSlices];
  int count;
};

// partial[block] = Σ of the squares of the block's tile, each square rounded to f32, in f64.
template <class T>
__global__ void sum_squares_tiles_kernel(const __grid_constant__ ClipTable t, double* partial) {
  __shared__ double shared[32];
  const ClipSlice& s = slice_of_block(t);
  const T* x = static_cast<const T*>(s.x);
  const int64_t start = int64_t(int(blockIdx.x) - s.first_block) * kTile;
  const int64_t end = min(s.n, start + kTile);
  double sum = 0;
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    const float v = to_f32(x[i]);
    sum += double(v * v);
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// out = Σ partial in a fixed order (one block: each thread a strided run, then the block's tree).
__global__ void sum_partials_kernel(const double* partial, int64_t count, float* out) {
  __shared__ double shared[32];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *out = float(sum);
}

template <class T>
__global__ void scale_tiles_kernel(const __grid_constant__ ClipTable t, const float* scale) {
  const ClipSlice& s = slice_of_block(t);
  const T* x = static_cast<const T*>(s.x);
  T* y = static_cast<T*>(s.y);
  const float c = *scale;
  const int64_t start = int64_t(int(blockIdx.x) - s.first_block) * kTile;
  const int64_t end = min(s.n, start + kTile);
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) y[i] = from_f32<T>(to_f32(x[i]) * c);
}

template <class T>
__global__ void add_tiles_kernel(const __grid_constant__ ClipTable t) {
  const ClipSlice& s = slice_of_block(t);
  const T* x = static_cast<const T*>(s.x);
  const T* z = static_cast<const T*>(s.z);
  T* y = static_cast<T*>(s.y);
  const int64_t start = int64_t(int(blockIdx.x) - s.first_block) * kTile;
  const int64_t end = min(s.n, start + kTile);
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) y[i] = from_f32<T>(to_f32(x[i]) + to_f32(z[i]));
}

// y = x in O's format, rounded as cast_kernel rounds (f32 to bf16: to nearest even).
template <class I, class O>
__global__ void cast_tiles_kernel(const __grid_constant__ ClipTable t) {
  const ClipSlice& s = slice_of_block(t);
  const I* x = static_cast<const I*>(s.x);
  O* y = static_cast<O*>(s.y);
  const int64_t start = int64_t(int(blockIdx.x) - s.first_block) * kTile;
  const int64_t end = min(s.n, start + kTile);
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) y[i] = from_f32<O>(float(load_double(x[i])));
}

// Calls launch(table, blocks, first_block_of_launch) for tables of up to kClipSlices of the
// tensors `in`; z_of(j) / y_of(j) are tensor j's second operand / output or nullptr. Returns the
// blocks launched in all.
template <class ZOf, class YOf, class Launch>
int64_t launch_clip_tables(const std::vector<Array>& in, ZOf z_of, YOf y_of, Launch launch) {
  ClipTable t{};
  int blocks = 0;
  int64_t launched = 0;
  auto flush = [&] {
    if (t.count > 0 && blocks > 0) launch(t, blocks, launched);
    launched += blocks;
    t = ClipTable{};
    blocks = 0;
  };
  for (size_t j = 0; j < in.size(); ++j) {
    const int64_t n = in[j].numel();
    if (n == 0) continue;
    const int64_t tensor_blocks = (n + kTile - 1) / kTile;
    if (t.count == kClipSlices || int64_t(blocks) + tensor_blocks > (int64_t(1) << 30)) flush();
    t.s[t.count++] = {in[j].raw(), z_of(j), y_of(j), n, blocks};
    blocks += int(tensor_blocks);
  }
  flush();
  return launched;
}

}  // namespace

void sum_squares_multi(const std::vector<Array>& in, Array& out) {
  int64_t tiles = 0;
  for (const Array& x : in) tiles += (x.numel() + kTile - 1) / kTile;
  float* o = mptr<float>(out);
  if (tiles == 0) {
    check(cudaMemsetAsync(o, 0, sizeof(float), stream()), "sum_squares_multi");
    return;
  }
  // f64 partial sums, one per tile (there is no f64 dtype; i64 has the size).
  Array partial = Array::empty({tiles}, DType::i64, out.device());
  double* part = static_cast<double*>(partial.raw());
  dispatch_device_float(in[0].dtype(), "sum_squares_multi", [&](auto type) {
    using T = decltype(type);
    launch_clip_tables(
        in, [](size_t) -> const void* { return nullptr; }, [](size_t) -> void* { return nullptr; },
        [&](const ClipTable& t, int blocks, int64_t first) {
          sum_squares_tiles_kernel<T><<<unsigned(blocks), kThreads, 0, stream()>>>(t, part + first);
          check_launch("sum_squares_multi");
        });
  });
  sum_partials_kernel<<<1, kThreads, 0, stream()>>>(part, tiles, o);
  check_launch("sum_squares_multi");
}

void scale_multi(const std::vector<Array>& in, const Array& scale, std::vector<Array>& outs) {
  if (in.empty()) return;
  const float* c = ptr<float>(scale);
  dispatch_device_float(in[0].dtype(), "scale_multi", [&](auto type) {
    using T = decltype(type);
    launch_clip_tables(
        in, [](size_t) -> const void* { return nullptr; }, [&](size_t j) -> void* { return outs[j].raw(); },
        [&](const ClipTable& t, int blocks, int64_t) {
          scale_tiles_kernel<T><<<unsigned(blocks), kThreads, 0, stream()>>>(t, c);
          check_launch("scale_multi");
        });
  });
}

void cast_multi(const std::vector<Array>& in, std::vector<Array>& outs) {
  if (in.empty()) return;
  dispatch_device_float(in[0].dtype(), "cast_multi", [&](auto from) {
    dispatch_device_float(outs[0].dtype(), "cast_multi", [&](auto to) {
      using I = decltype(from);
      using O = decltype(to);
      launch_clip_tables(
          in, [](size_t) -> const void* { return nullptr; }, [&](size_t j) -> void* { return outs[j].raw(); },
          [&](const ClipTable& t, int blocks, int64_t) {
            cast_tiles_kernel<I, O><<<unsigned(blocks), kThreads, 0, stream()>>>(t);
            check_launch("cast_multi");
          });
    });
  });
}

void add_multi(const std::vector<Array>& in, std::vector<Array>& outs) {
  const size_t k = in.size() / 2;
  if (k == 0) return;
  const std::vector<Array> a(in.begin(), in.begin() + std::ptrdiff_t(k));
  dispatch_device_float(in[0].dtype(), "add_multi", [&](auto type) {
    using T = decltype(type);
    launch_clip_tables(
        a, [&](size_t j) -> const void* { return in[k + j].raw(); }, [&](size_t j) -> void* { return outs[j].raw(); },
        [&](const ClipTable& t, int blocks, int64_t) {
          add_tiles_kernel<T><<<unsigned(blocks), kThreads, 0, stream()>>>(t);
          check_launch("add_multi");
        });
  });
}

}  // namespace mt::cuda
