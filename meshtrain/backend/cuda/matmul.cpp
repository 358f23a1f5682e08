// Batched GEMM through cuBLASLt. Row-major C = op(A) op(B) is computed as the column-major
// product C^T = op(B)^T op(A)^T, i.e. with the operands swapped and no copies. f32 is true
// f32 unless the run allows TF32; 16-bit inputs accumulate in f32. Descriptors and the
// algorithm are cached per shape, so a training step only executes. The algorithm: cuBLASLt's
// heuristic proposes up to kCandidates; a large GEMM times them on its first run that writes
// (not accumulates) its output and keeps the fastest. The heuristic's first choice is far from
// the fastest for some shapes, e.g. GPT-2's output layer, whose 50257-wide rows are not
// 16-byte aligned. Timings vary, so two runs may choose different algorithms and round
// differently: MT_MATMUL_TUNING=0 keeps the heuristic's first choice, and multi-process runs
// do not tune (set_matmul_tuning), so that replicated products round alike on every rank.
#include <cublasLt.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/backend/cuda/cublaslt_library.h"
#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/step_graph_hooks.h"
#include "meshtrain/backend/cuda/timing_events.h"
#include "meshtrain/backend/matmul.h"

namespace mt::cuda {

using kernels::MatmulDType;

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(detail::concat("[matmul] cuBLASLt ", what, " failed: cublasStatus_t ", int(s)));
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int kCandidates = 8;
// GEMMs below this many FLOPs keep the heuristic's choice: timing them would cost more than
// it could save (and decoding's shapes change with every token).
constexpr double kTuneFlops = 4e9;

// A shape's descriptors and algorithm. Shared: a call holds its plan while cuBLASLt reads it,
// so that another thread dropping it from the cache cannot destroy it under the call.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's order
  cublasLtMatmulAlgo_t algo{};
  bool found = false, tuned = false;
  uint64_t last_used = 0;  // the cache's clock at its last call

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) cublaslt().MatrixLayoutDestroy(l);
    if (desc) cublaslt().MatmulDescDestroy(desc);
  }
};

// dtype, batch, batch_a, batch_b, M, N, K, trans_a, trans_b, tf32, bias epilogue.
using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool, bool>;

// Plans per shape, at most `capacity` of them: decoding and padded batches meet a new shape
// with every length, and a server would otherwise keep every one it ever met.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, std::shared_ptr<Plan>> plans;
  uint64_t clock = 0;  // advanced by every call, under the mutex
  uint64_t created = 0;
  std::mutex mutex;

  // Drops the plans unused longest (never `keep`) until within capacity. Caller holds mutex.
  void evict_beyond_capacity(const Plan* keep);
};

// Kept outside Lt: reading the counters or setting the bound must not load cuBLASLt (a CPU
// run's server reports them too, on machines with no GPU at all). The capacity is read from
// the environment at first use (0: not yet), as the CPU's is, not during static init.
std::atomic<size_t> g_capacity{0};
std::atomic<Lt*> g_lt{nullptr};

size_t capacity() {
  size_t c = g_capacity.load(std::memory_order_relaxed);
  if (c != 0) return c;
  size_t unset = 0;
  const size_t from_env = kernels::matmul_plan_capacity_from_env();
  return g_capacity.compare_exchange_strong(unset, from_env) ? from_env : unset;
}

void Lt::evict_beyond_capacity(const Plan* keep) {
  while (plans.size() > capacity()) {
    auto oldest = plans.end();
    for (auto it = plans.begin(); it != plans.end(); ++it)
      if (it->second.get() != keep && (oldest == plans.end() || it->second->last_used < oldest->second->last_used))
        oldest = it;
    if (oldest == plans.end()) return;
    plans.erase(oldest);
  }
}

Lt& lt() {
  static Lt* s = [] {
    auto* l = new Lt();  // leaked: lives as long as the process's stream
    check_lt(cublaslt().Create(&l->handle), "create");
    check(cudaMalloc(&l->workspace, kWorkspaceBytes), "matmul workspace");
    g_lt.store(l, std::memory_order_release);
    return l;
  }();
  return *s;
}

cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublaslt().MatrixLayoutCreate(&l, t, uint64_t(rows), uint64_t(cols), ld), "layout");
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    check_lt(cublaslt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), "layout");
    check_lt(cublaslt().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
             "layout");
  }
  return l;
}

// Column-major view: first operand = B (N x K, or K x N stored), second = A. With `bias` the
// epilogue adds a vector along D's N rows (the row-major output's columns) to the f32
// accumulator; its pointer is set per call.
std::shared_ptr<Plan> make_plan(MatmulDType dtype, int64_t batch, int64_t batch_a, int64_t batch_b, int64_t M,
                                int64_t N, int64_t K, bool ta, bool tb, bool bias) {
  cudaDataType_t in = CUDA_R_32F, out = CUDA_R_32F;
  if (dtype == MatmulDType::bf16) in = out = CUDA_R_16BF;
  if (dtype == MatmulDType::f16) in = out = CUDA_R_16F;
  if (dtype == MatmulDType::bf16_f32 || dtype == MatmulDType::f32_as_bf16) in = CUDA_R_16BF;
  const cublasComputeType_t compute =
      dtype == MatmulDType::f32_as_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  auto plan = std::make_shared<Plan>();
  Plan& p = *plan;
  check_lt(cublaslt().MatmulDescCreate(&p.desc, compute, CUDA_R_32F), "descriptor");
  const cublasOperation_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), "descriptor");
  check_lt(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
           "descriptor");
  if (bias) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check_lt(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
             "descriptor");
    // The heuristic reads the pointer's alignment: a stand-in aligned to exactly 16 bytes (what
    // matmul_bias guarantees) until the call sets the real one, so no algorithm it offers
    // needs more.
    const void* stand_in = static_cast<const char*>(lt().workspace) + 16;
    check_lt(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &stand_in, sizeof(stand_in)),
             "descriptor");
  }
  // B row-major (K, N) is column-major N x K (ld N); stored transposed (N, K) it is K x N (ld K).
  p.a = tb ? layout(in, K, N, K, batch, batch_b == 1 ? 0 : N * K) : layout(in, N, K, N, batch, batch_b == 1 ? 0 : N * K);
  p.b = ta ? layout(in, M, K, M, batch, batch_a == 1 ? 0 : M * K) : layout(in, K, M, K, batch, batch_a == 1 ? 0 : M * K);
  p.c = layout(out, N, M, N, batch, M * N);
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublaslt().MatmulPreferenceCreate(&pref), "preference");
  check_lt(cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspaceBytes,
                                                sizeof(kWorkspaceBytes)),
           "preference");
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t s =
      cublaslt().MatmulAlgoGetHeuristic(lt().handle, p.desc, p.a, p.b, p.c, p.c, pref, kCandidates, results, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  if (s == CUBLAS_STATUS_SUCCESS && found > 0) {
    for (int i = 0; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(results[i].algo);
    p.found = !p.candidates.empty();
    if (p.found) p.algo = p.candidates.front();
  }
  return plan;
}

std::atomic<bool> g_tuning_allowed{true};

bool tuning_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MT_MATMUL_TUNING");
    return !(v && std::string(v) == "0");
  }();
  return on && g_tuning_allowed.load(std::memory_order_relaxed);
}

// Times each candidate (one warm-up, then two runs) writing c, keeps the fastest. Runs once
// per shape; the caller's own run then overwrites c.
void tune(Lt& l, Plan& p, const void* a, const void* b, void* c) {
  TimingEvents events("matmul tuning");
  const float alpha = 1.0f, beta = 0.0f;
  float best = -1.0f;
  for (const cublasLtMatmulAlgo_t& algo : p.candidates) {
    // Runs the cuBLASLt call; a failure leaves no CUDA error behind to be blamed on a later
    // kernel.
    auto run = [&] {
      const bool ok = cublaslt().Matmul(l.handle, p.desc, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &algo,
                                     l.workspace, kWorkspaceBytes, stream()) == CUBLAS_STATUS_SUCCESS;
      if (!ok) cudaGetLastError();
      return ok;
    };
    if (!run()) continue;
    events.start(stream());
    const bool ok = run() && run();
    events.stop(stream());
    const float ms = events.elapsed_ms();
    if (ok && (best < 0.0f || ms < best)) {
      best = ms;
      p.algo = algo;
    }
  }
  p.tuned = true;
}

}  // namespace

void set_matmul_tuning(bool allowed) { g_tuning_allowed.store(allowed, std::memory_order_relaxed); }

size_t set_matmul_cache_capacity(size_t plans) {
  MT_CHECK(plans >= 1, "[matmul] the plan cache must hold at least one plan");
  const size_t previous = capacity();  // the environment's value, when nothing set one yet
  g_capacity.store(plans);
  if (Lt* l = g_lt.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(l->mutex);
    l->evict_beyond_capacity(nullptr);
  }
  return previous;
}

size_t matmul_cache_size() {
  Lt* l = g_lt.load(std::memory_order_acquire);
  if (!l) return 0;
  std::lock_guard<std::mutex> lock(l->mutex);
  return l->plans.size();
}

uint64_t matmul_plans_created() {
  Lt* l = g_lt.load(std::memory_order_acquire);
  if (!l) return 0;
  std::lock_guard<std::mutex> lock(l->mutex);
  return l->created;
}

namespace {

// One cuBLASLt product: c = op(a) op(b) (+ c when accumulating) (+ bias along N when `bias` is
// given). Returns false, having run nothing, when cuBLASLt has no algorithm with the bias
// epilogue for this shape or refuses the call (the caller then adds the bias itself).
bool run_matmul(MatmulDType dtype, const void* a, const void* b, const void* bias, void* c, int64_t batch,
                int64_t batch_a, int64_t batch_b, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b,
                bool accumulate) {
  Lt& l = lt();
  const Key key{int(dtype), batch, batch_a, batch_b, M, N, K, trans_a, trans_b, dtype == MatmulDType::f32_as_tf32,
                bias != nullptr};
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  Array a16, b16;
  if (dtype == MatmulDType::f32_as_bf16) {
    // Operands rounded to bf16 in staging buffers (never in the caller's arrays), before the
    // lock: an allocation waits out another thread's capture, which may itself want the lock.
    const int64_t na = batch_a * M * K, nb = batch_b * K * N;
    a16 = Array::empty({na}, DType::bf16, Device::cuda(active_device()));
    b16 = Array::empty({nb}, DType::bf16, Device::cuda(active_device()));
    round_f32_to_bf16(static_cast<const float*>(a), a16.raw(), na);
    round_f32_to_bf16(static_cast<const float*>(b), b16.raw(), nb);
    a = a16.raw();
    b = b16.raw();
  }
  // The plan's handles and algorithm, copied under the lock: a tuning call may change the
  // algorithm of a plan another thread already holds. A bias plan's pointer lives in its
  // shared descriptor, so its call is enqueued under the lock too.
  std::unique_lock<std::mutex> lock(l.mutex);
  auto it = l.plans.find(key);
  const bool created = it == l.plans.end();
  if (created) {
    it = l.plans.emplace(key, make_plan(dtype, batch, batch_a, batch_b, M, N, K, trans_a, trans_b, bias != nullptr))
             .first;
    ++l.created;
  }
  const std::shared_ptr<Plan> held = it->second;
  Plan& p = *held;
  p.last_used = ++l.clock;
  if (created) l.evict_beyond_capacity(&p);  // only a new plan (or a lower capacity) can go past it
  if (bias && !p.found) return false;
  if (bias)
    check_lt(cublaslt().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
             "bias pointer");
  // Tuning times candidates with events and waits for them: never while a graph is being
  // recorded (a shape first met inside a capture keeps cuBLASLt's first choice).
  if (p.found && !p.tuned && !accumulate && p.candidates.size() > 1 && tuning_enabled() &&
      !capture_hooks::capturing_on_this_thread() &&
      2.0 * double(batch) * double(M) * double(N) * double(K) >= kTuneFlops)
    tune(l, p, a, b, c);
  const struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool found;
  } plan{p.desc, p.a, p.b, p.c, p.algo, p.found};
  if (!bias) lock.unlock();
  MT_CHECK(plan.found, "[matmul] cuBLASLt has no algorithm for batch ", batch, " (", batch_a, ", ", batch_b, ") M ", M,
           " N ", N, " K ", K, trans_a ? " A^T" : "", trans_b ? " B^T" : "");
  const cublasStatus_t status = cublaslt().Matmul(l.handle, plan.desc, &alpha, b, plan.a, a, plan.b, &beta, c, plan.c,
                                                  c, plan.c, &plan.algo, l.workspace, kWorkspaceBytes, stream());
  if (bias && status != CUBLAS_STATUS_SUCCESS) {
    // An epilogue the library refuses at run time (an alignment it wanted after all): this
    // shape takes the product and a bias pass from now on, as when no algorithm was found.
    cudaGetLastError();
    p.found = false;
    return false;
  }
  check_lt(status, "matmul");
  return true;
}

bool out_is_f32(MatmulDType dtype) {
  return dtype == MatmulDType::f32 || dtype == MatmulDType::f32_as_tf32 || dtype == MatmulDType::bf16_f32 ||
         dtype == MatmulDType::f32_as_bf16;
}

}  // namespace

void matmul(MatmulDType dtype, const void* a, const void* b, void* c, int64_t batch, int64_t batch_a, int64_t batch_b,
            int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, bool accumulate) {
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) {  // an empty contraction is a zero product
    if (!accumulate)
      check(cudaMemsetAsync(c, 0, size_t(batch * M * N) * (out_is_f32(dtype) ? 4 : 2), stream()), "matmul");
    return;
  }
  run_matmul(dtype, a, b, nullptr, c, batch, batch_a, batch_b, M, N, K, trans_a, trans_b, accumulate);
}

void matmul_bias(MatmulDType dtype, const void* a, const void* b, const void* bias, void* c, int64_t M, int64_t N,
                 int64_t K, bool trans_a, bool trans_b) {
  if (M == 0 || N == 0) return;
  MT_CHECK(bias != nullptr, "[matmul] null bias pointer for M=", M, " N=", N, " K=", K);
  const DType out = out_is_f32(dtype) ? DType::f32 : dtype == MatmulDType::f16 ? DType::f16 : DType::bf16;
  // The epilogue where cuBLASLt offers one for the shape and the bias is aligned as it asks;
  // else the product, then a pass adding the bias.
  const bool aligned = reinterpret_cast<uintptr_t>(bias) % 16 == 0;
  if (K > 0 && aligned && run_matmul(dtype, a, b, bias, c, 1, 1, 1, M, N, K, trans_a, trans_b, false)) return;
  matmul(dtype, a, b, c, 1, 1, 1, M, N, K, trans_a, trans_b, false);
  add_bias_rows(out, c, bias, M, N);
}

}  // namespace mt::cuda
