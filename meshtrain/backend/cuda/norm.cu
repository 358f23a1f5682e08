// Layer norm (center) and RMS norm over the last dim of x viewed as (N, C), forward and the
// first-order backward from the saved statistics, with the CPU kernel's arithmetic:
// statistics in f32 from double sums, two-pass variance, weight/bias gradients summed per
// 64-row chunk and then over chunks in order (deterministic). With a dropout branch the
// forward first forms s = x + dropout(branch) in the same kernel (each thread reads back only
// the elements it wrote), and the backward writes dropout(dx) beside dx.
// Rows up to kWarpRowMax wide get one warp each (8 rows per block; shuffles, no barriers); wider
// rows one block each. With a block per 768-wide row, GPT-2's (16384, 768) layer norm took
// 0.6 ms on an H200 (50 times its memory time): 16384 short blocks, each waiting on two
// barrier reductions, in 31 waves.
#include "meshtrain/backend/cuda/chunk_sums.cuh"
#include "meshtrain/backend/cuda/stream_block.cuh"
#include "meshtrain/backend/norm.h"

namespace mt::cuda {

namespace {

int64_t row_count(const Array& x) { return x.ndim() == 0 ? 1 : x.numel() / x.dim(-1); }

constexpr int64_t kWarpRowMax = 2048;
constexpr int kRowsPerBlock = 8;

// The threads that share one row: a warp (kWarp) or the whole block.
template <bool kWarp>
struct RowTeam {
  int64_t row;
  int lane, size;
  __device__ RowTeam() {
    if constexpr (kWarp) {
      row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
      lane = int(threadIdx.x & 31);
      size = 32;
    } else {
      row = blockIdx.x;
      lane = int(threadIdx.x);
      size = int(blockDim.x);
    }
  }
  __device__ double sum(double v, double* shared) const {
    if constexpr (kWarp) return warp_sum(v);
    else return block_sum(v, shared);
  }
  // The team's writes to its row are seen by the whole team after this.
  __device__ void sync() const {
    if constexpr (kWarp) __syncwarp();
    else __syncthreads();
  }
};

template <class W>
__device__ inline float param_or(const W* p, int64_t i, float absent) {
  return p ? to_f32(p[i]) : absent;
}

// The branch of a fused residual norm on the device (branch == nullptr: a plain norm).
template <class T>
struct DeviceBranch {
  const T* input = nullptr;  // forward
  T* sum = nullptr;          // forward: x + dropout(input)
  T* grad = nullptr;         // backward: dropout(dx)
  uint64_t seed = 0, stream_id = 0;
  const int64_t* fold_last = nullptr;  // the key's last fold, folded in by each thread first
  uint32_t keep_from = 0;  // kernels::keep_steps(rate)
  float scale = 0;
  BlockMap map;
};

template <class T>
DeviceBranch<T> device_branch(const kernels::DropoutBranch* b, const Shape& shape) {
  DeviceBranch<T> d;
  if (!b) return d;
  d.input = b->input.defined() ? ptr<T>(b->input) : nullptr;
  // The branch's output arrays are written through handles the caller owns.
  d.sum = b->sum.defined() ? static_cast<T*>(b->sum.raw()) : nullptr;
  d.grad = b->grad.defined() ? static_cast<T*>(b->grad.raw()) : nullptr;
  d.seed = b->key.seed;
  d.stream_id = b->key.stream;
  d.fold_last = b->rate > 0 ? fold_last_address(b->key) : nullptr;  // no draws at rate 0 (eval)
  d.keep_from = kernels::keep_steps(b->rate);
  d.scale = b->rate < 1.0 ? float(1.0 / (1.0 - b->rate)) : 0.0f;
  d.map = block_map(shape, b->block, "layer_norm");
  return d;
}

template <class T>
__device__ inline bool keeps(const DeviceBranch<T>& br, int64_t i) {
  return keeps_at_block(br.map, i, br.seed, br.stream_id, br.keep_from);
}

// f(i, keep) for the elements of row r this thread takes, with element (r, i)'s dropout verdict.
// Over a whole array whose rows are a multiple of 4 long, a thread takes runs of 4 consecutive
// elements and draws one Philox block for each run (the same words as one draw per element,
// which drew every block four times over); otherwise one element at a time at its global
// position. At rate 0 (eval) nothing is drawn and everything is kept.
template <bool kWarp, class T, class F>
__device__ inline void for_branch_elements(const DeviceBranch<T>& br, const RowTeam<kWarp>& team, int64_t r,
                                           int64_t c, F&& f) {
  if (br.map.ndim == 0 && c % 4 == 0) {
    for (int64_t i4 = 4 * int64_t(team.lane); i4 < c; i4 += 4 * int64_t(team.size)) {
      bool keep[4];
      keeps4(uint64_t(r * c + i4) / 4, br.seed, br.stream_id, br.keep_from, keep);
#pragma unroll
      for (int q = 0; q < 4; ++q) f(i4 + q, keep[q]);
    }
  } else {
    for (int64_t i = team.lane; i < c; i += team.size) f(i, keeps(br, r * c + i));
  }
}

template <bool kWarp, class T, class W>
__global__ void norm_forward_kernel(bool center, const T* x, const W* w, const W* b, double eps, T* y, float* mean,
                                   float* rstd, int64_t n, int64_t c, DeviceBranch<T> br) {
  br.stream_id = stream_of(br.stream_id, br.fold_last);
  __shared__ double shared[32];
  const RowTeam<kWarp> team;
  const int64_t r = team.row;
  if (r >= n) return;  // a whole warp: the warp's shuffles see no absent lane
  const T* xr = x + r * c;
  if (br.input) {
    // s = x + dropout(branch), rounded as the composed ops; the rows below read s.
    T* sr = br.sum + r * c;
    for_branch_elements(br, team, r, c, [&](int64_t i, bool keep) {
      const float kept = __fmul_rn(to_f32(br.input[r * c + i]), br.scale);  // never fused into the sum
      const float dropped = to_f32(keep ? from_f32<T>(kept) : from_f32<T>(0.0f));
      sr[i] = from_f32<T>(to_f32(xr[i]) + dropped);
    });
    team.sync();  // the loops below read s at positions other threads wrote
    xr = sr;
  }
  double s = 0;
  if (center) {
    for (int64_t i = team.lane; i < c; i += team.size) s += double(to_f32(xr[i]));
    s = team.sum(s, shared);
  }
  const float mu = center ? float(s / double(c)) : 0.0f;
  double ss = 0;
  for (int64_t i = team.lane; i < c; i += team.size) {
    const double d = double(to_f32(xr[i])) - double(mu);
    ss += d * d;
  }
  ss = team.sum(ss, shared);
  const float rs = float(1.0 / sqrt(ss / double(c) + eps));
  if (team.lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  T* yr = y + r * c;
  for (int64_t i = team.lane; i < c; i += team.size)
    yr[i] = from_f32<T>((to_f32(xr[i]) - mu) * rs * param_or(w, i, 1.0f) + param_or(b, i, 0.0f));
}

template <bool kWarp, class T, class W>
__global__ void norm_backward_dx_kernel(bool center, const T* g, const T* x, const W* w, const float* mean,
                                        const float* rstd, T* dx, int64_t n, int64_t c, DeviceBranch<T> br) {
  br.stream_id = stream_of(br.stream_id, br.fold_last);
  __shared__ double shared[32];
  const RowTeam<kWarp> team;
  const int64_t r = team.row;
  if (r >= n) return;
  const float mu = center ? mean[r] : 0.0f, rs = rstd[r];
  const T* xr = x + r * c;
  const T* gr = g + r * c;
  double sum_gy = 0, sum_gy_xhat = 0;
  for (int64_t i = team.lane; i < c; i += team.size) {
    const float xhat = (to_f32(xr[i]) - mu) * rs;
    const float gy = to_f32(gr[i]) * param_or(w, i, 1.0f);
    sum_gy += gy;
    sum_gy_xhat += double(gy) * xhat;
  }
  sum_gy = team.sum(sum_gy, shared);
  sum_gy_xhat = team.sum(sum_gy_xhat, shared);
  const float a = center ? float(sum_gy / double(c)) : 0.0f;
  const float bcoef = float(sum_gy_xhat / double(c));
  T* dxr = dx + r * c;
  auto write = [&](int64_t i, bool keep) {
    const float xhat = (to_f32(xr[i]) - mu) * rs;
    const float gy = to_f32(gr[i]) * param_or(w, i, 1.0f);
    const T d = from_f32<T>(rs * (gy - a - xhat * bcoef));
    dxr[i] = d;
    if (br.grad) br.grad[r * c + i] = keep ? from_f32<T>(to_f32(d) * br.scale) : from_f32<T>(0.0f);
  };
  if (br.grad) for_branch_elements(br, team, r, c, write);
  else for (int64_t i = team.lane; i < c; i += team.size) write(i, true);
}

// part_w/part_b: (chunks, C) double partial sums of g·xhat and g over 64-row chunks.
template <class T>
__global__ void norm_param_partials_kernel(bool center, const T* g, const T* x, const float* mean, const float* rstd,
                                           double* part_w, double* part_b, int64_t n, int64_t c) {
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= c) return;
  const int64_t ch = blockIdx.x, r0 = ch * kRowChunk, r1 = min(n, r0 + kRowChunk);
  double sw = 0, sb = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float gv = to_f32(g[r * c + i]);
    const float xhat = (to_f32(x[r * c + i]) - (center ? mean[r] : 0.0f)) * rstd[r];
    sw += double(gv) * xhat;
    sb += gv;
  }
  if (part_w) part_w[ch * c + i] = sw;
  if (part_b) part_b[ch * c + i] = sb;
}

template <class F>
void dispatch_x_w(const Array& x, const Array& w, const Array& b, const char* op, F&& f) {
  const DType param = w.defined() ? w.dtype() : b.defined() ? b.dtype() : DType::f32;
  dispatch_device_float(x.dtype(), op, [&](auto xt) { dispatch_device_float(param, op, [&](auto wt) { f(xt, wt); }); });
}

int norm_threads(int64_t c) { return c <= 64 ? 64 : c <= 128 ? 128 : c <= 256 ? 256 : 512; }

// Launches a row kernel over n rows of c: its warp-per-row form up to kWarpRowMax wide, its
// block-per-row form beyond.
template <class... Params, class... Args>
void launch_rows(int64_t n, int64_t c, void (*warp_rows)(Params...), void (*block_rows)(Params...), Args... args) {
  if (c <= kWarpRowMax)
    warp_rows<<<unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, stream()>>>(args...);
  else
    block_rows<<<unsigned(n), norm_threads(c), 0, stream()>>>(args...);
}

}  // namespace

void norm_forward(bool center, const Array& x, const Array& weight, const Array& bias, double eps, Array& y,
                  Array& mean, Array& rstd, const kernels::DropoutBranch* branch) {
  const char* op = center ? "layer_norm" : "rms_norm";
  const int64_t c = x.dim(-1), n = row_count(x);
  if (n * c == 0) return;
  dispatch_x_w(x, weight, bias, op, [&](auto xt, auto wt) {
    using T = decltype(xt);
    using W = decltype(wt);
    const W* w = weight.defined() ? ptr<W>(weight) : nullptr;
    const W* b = bias.defined() ? ptr<W>(bias) : nullptr;
    launch_rows(n, c, norm_forward_kernel<true, T, W>, norm_forward_kernel<false, T, W>, center, ptr<T>(x), w, b, eps,
                mptr<T>(y), mptr<float>(mean), mptr<float>(rstd), n, c, device_branch<T>(branch, x.shape()));
  });
  check_launch(op);
}

void norm_backward(bool center, const Array& g, const Array& x, const Array& weight, const Array& mean,
                   const Array& rstd, Array& dx, Array* dweight, Array* dbias, const kernels::DropoutBranch* branch) {
  const char* op = center ? "layer_norm" : "rms_norm";
  const int64_t c = x.dim(-1), n = row_count(x);
  if (n * c == 0) return;
  dispatch_x_w(x, weight, Array(), op, [&](auto xt, auto wt) {
    using T = decltype(xt);
    using W = decltype(wt);
    const W* w = weight.defined() ? ptr<W>(weight) : nullptr;
    launch_rows(n, c, norm_backward_dx_kernel<true, T, W>, norm_backward_dx_kernel<false, T, W>, center, ptr<T>(g),
                ptr<T>(x), w, ptr<float>(mean), ptr<float>(rstd), mptr<T>(dx), n, c, device_branch<T>(branch, x.shape()));
    check_launch(op);
    if (!dweight && !dbias) return;
    const int64_t chunks = (n + kRowChunk - 1) / kRowChunk;
    // Scratch for double partial sums: 8-byte elements (there is no f64 dtype; i64 has the size).
    Array part_w = dweight ? Array::empty({chunks, c}, DType::i64, x.device()) : Array();
    Array part_b = dbias ? Array::empty({chunks, c}, DType::i64, x.device()) : Array();
    double* pw = dweight ? static_cast<double*>(part_w.raw()) : nullptr;
    double* pb = dbias ? static_cast<double*>(part_b.raw()) : nullptr;
    const dim3 grid(unsigned(chunks), unsigned((c + kThreads - 1) / kThreads));
    norm_param_partials_kernel<<<grid, kThreads, 0, stream()>>>(center, ptr<T>(g), ptr<T>(x), ptr<float>(mean),
                                                                ptr<float>(rstd), pw, pb, n, c);
    check_launch(op);
    auto finish = [&](const double* part, Array& out) {
      dispatch_device_float(out.dtype(), op, [&](auto ot) {
        using O = decltype(ot);
        sum_chunks_kernel<<<blocks_for(c), kThreads, 0, stream()>>>(part, mptr<O>(out), chunks, c);
      });
      check_launch(op);
    };
    if (dweight) finish(pw, *dweight);
    if (dbias) finish(pb, *dbias);
  });
}

}  // namespace mt::cuda
