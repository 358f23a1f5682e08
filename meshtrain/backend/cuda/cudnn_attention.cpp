#include "meshtrain/backend/cuda/cudnn_attention.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/cuda/cudnn_attention_graphs.h"
#include "meshtrain/backend/cuda/measured_route.h"
#include "meshtrain/backend/cuda/step_graph.h"
#include "meshtrain/backend/cuda/timing_events.h"

namespace mt::cuda {

using Dims = std::array<int64_t, 4>;

CudnnAttentionMode cudnn_attention_mode() {
  const char* v = std::getenv("MT_ATTENTION_CUDNN");
  if (!v || !*v || std::strcmp(v, "0") == 0) return CudnnAttentionMode::off;
  if (std::strcmp(v, "1") == 0) return CudnnAttentionMode::without_dropout;
  if (std::strcmp(v, "all") == 0) return CudnnAttentionMode::all;
  if (std::strcmp(v, "auto") == 0) return CudnnAttentionMode::measured;
  throw Error(detail::concat("[attention] MT_ATTENTION_CUDNN='", v,
                             "': expected 0, 1 (cuDNN's fused attention without dropout), all (with dropout "
                             "too, cuDNN's own mask) or auto (as 1, each shape's direction on cuDNN or the "
                             "kernels, whichever its first calls measured faster)"));
}

std::string cudnn_attention_ineligibility(const Array& q, const Array& k, const Array& v, const Array& out,
                                          const kernels::FlashAttentionShape& s, CudnnAttentionMode mode) {
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16)
    return std::string(dtype_name(q.dtype())) + " arrays (cuDNN's fused attention takes bf16 and f16)";
  if (s.dropout_rate > 0 && mode != CudnnAttentionMode::all)
    return "dropout (cuDNN would draw its own mask, not dropout()'s Philox stream: MT_ATTENTION_CUDNN=all allows it)";
  if (s.dropout_rate >= 1) return "a dropout rate of 1";
  // (Which also keeps cached decoding off the route: one query against a cache that grows each
  // step would be a new shape, and a new plan, at every token.)
  if (s.causal && s.tq != s.tk) return "a causal mask with Tq != Tk";
  if (s.d <= 0 || s.d % 8 != 0 || s.d > 128) return "head dim " + std::to_string(s.d) + " (multiples of 8 up to 128)";
  if (s.tq <= 0 || s.tk <= 0) return "no rows";
  // cuDNN's frontend refuses this backward on every version (and causal with one query before
  // cuDNN 9.10, which Tq == Tk == 1 covers here).
  if (s.tq == 1 && s.tk == 1) return "one query and one key";
  if (s.heads <= 0 || s.batch_heads % s.heads != 0 || s.group <= 0 || s.heads % s.group != 0)
    return "heads that do not divide the slices";
  if (s.key_mask) {
    // Masked keys take bf16's lowest as a bias: their scores round to it in f32. f16's lowest
    // (-65504) would leave them apart, so a row with no visible key would not be uniform.
    if (q.dtype() != DType::bf16) return "a key-padding mask on f16 arrays (its bias is bf16's lowest)";
    // An additive bias lets the backward's gradient reach masked scores, which is 0 only where
    // their probability is: a causal row whose visible keys are all masked (left padding) gives
    // each probability 1 and would get gradients the kernels zero.
    if (s.causal) return "a key-padding mask with the causal mask";
    if (s.tk % 8 != 0)
      return "a key-padding mask over " + std::to_string(s.tk) + " keys (multiples of 8: 16-byte aligned bias rows)";
    if (s.mask_batches != 1 && s.mask_batches != s.batch_heads / s.heads)
      return "a key-padding mask of " + std::to_string(s.mask_batches) + " rows for " +
             std::to_string(s.batch_heads / s.heads) + " batches";
  }
  for (const Array* a : {&q, &k, &v, &out})
    if (reinterpret_cast<uintptr_t>(a->raw()) % 16 != 0) return "an array not 16-byte aligned";
  const CudnnAttentionGeometry geo = cudnn_attention_geometry(q.dtype(), s);
  for (const Dims* strides : {&geo.q_strides, &geo.k_strides, &geo.v_strides, &geo.o_strides})
    for (int i = 0; i < 3; ++i)
      if ((*strides)[i] % 8 != 0) return "rows not 16-byte aligned";
  return "";
}

namespace {

// MT_ATTENTION_CUDNN=auto's trial of one shape's direction (measured_route.h): the kernels are
// its first route, cuDNN its second. Each timed call is bracketed by two events on the stream,
// read (waited for) once the trial's last call is issued: one host wait per shape and
// direction, in the eager steps that come before any capture.
struct RouteTiming {
  struct Pending {
    MeasuredRoute::Route route;
    TimingEvents events;
  };
  MeasuredRoute route;
  std::vector<Pending> pending;
};

// One shape's two directions, each planned on first use (no plan: cuDNN refused it, said
// once). Kept and dropped together: with dropout the forward plans both before it draws
// cuDNN's mask (its backward then follows the op's record of that, FlashAttentionShape).
struct PlannedAttention {
  struct Direction {
    cudnn_graph::Graph graph;
    cudnn_graph::Plan plan;
    bool tried = false;
    bool bias_rows_written = false;  // the plan reads the key mask's bias row by row
    RouteTiming timing;              // MT_ATTENTION_CUDNN=auto: cuDNN or the kernels, measured
  };
  Direction forward, backward;
  uint64_t last_used = 0;
  // Ran inside a captured step: the graph replays its kernels, which the plan may own (the
  // engines compiled at run time), so it is never evicted.
  bool captured = false;
};

// Shapes planned, at most this many: a server meets a new prompt length with every request.
constexpr size_t kMaxPlans = 64;

// A key mask's bias written out row by row (cuDNN refusing its 0 stride) is made at every call:
// shapes that would need more are left to the kernels.
constexpr int64_t kMaxWrittenBiasBytes = int64_t(128) << 20;

struct CudnnAttentionState {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  std::string unavailable;  // why cuDNN could not be loaded or its handle made
  bool tried = false;
  float mask_value = -std::numeric_limits<float>::infinity();
  std::map<std::vector<int64_t>, std::unique_ptr<PlannedAttention>> plans;
  uint64_t clock = 0;
  uint64_t forwards = 0, backwards = 0;
  std::string last_refusal;
  std::vector<std::string> measured_choices;  // MT_ATTENTION_CUDNN=auto's, one line each
  size_t version = 0;  // cuDNN's, at run time
  bool announced = false;
};

CudnnAttentionState& state() {
  static CudnnAttentionState* s = new CudnnAttentionState();  // leaked: lives as long as the stream
  return *s;
}

// Makes the handle on first use. Caller holds the mutex.
bool ready(CudnnAttentionState& st) {
  if (st.tried) return st.handle != nullptr;
  st.tried = true;
  try {
    const CudnnLibrary& l = cudnn();
    // The fused attention engines are compiled at run time by NVRTC, which cuDNN loads by name:
    // made global here when the CUDA toolkit's or the nvidia wheel's copy is on the loader's
    // path (a process that has not imported PyTorch may not have it otherwise). Without it,
    // cuDNN refuses the graphs and its reason names NVRTC.
    const std::string nvrtc = "libnvrtc.so." + std::to_string(CUDART_VERSION / 1000);
    if (!dlopen(nvrtc.c_str(), RTLD_NOW | RTLD_GLOBAL))
      std::cerr << "[cudnn attention] " << nvrtc << " is not on the loader's path: cuDNN's runtime-compiled "
                << "attention engines may be missing\n";
    stream();  // the process's GPU is current from here
    const cudnnStatus_t status = l.Create(&st.handle);
    st.version = l.GetVersion();
    if (status != CUDNN_STATUS_SUCCESS) {
      st.unavailable = "cudnnCreate: " + cudnn_graph::status_text(status);
      st.handle = nullptr;
    } else if (st.version == 91000 || st.version == 91001) {
      // Its frontend refuses bf16 and f16 attention on these two releases for known bugs.
      st.unavailable = "cuDNN " + std::to_string(st.version) + " has known bugs in its fused attention (its " +
                       "frontend refuses it there); use another cuDNN 9";
    } else if (st.version < 91000) {
      st.mask_value = std::numeric_limits<float>::lowest();
    }
  } catch (const std::exception& e) {
    st.unavailable = e.what();
  }
  if (!st.unavailable.empty())
    std::cerr << "[cudnn attention] MT_ATTENTION_CUDNN is set but cuDNN is unavailable: " << st.unavailable
              << "; the attention kernels of this build run instead\n";
  return st.handle != nullptr;
}

std::string describe(const CudnnAttentionGeometry& g) {
  return detail::concat("B ", g.batch, " H ", g.heads, " Hkv ", g.kv_heads, " Tq ", g.tq, " Tk ", g.tk, " D ", g.d,
                        g.causal ? " causal" : "", g.key_bias ? " key mask" : "",
                        g.dropout_rate > 0 ? detail::concat(" dropout ", g.dropout_rate) : "",
                        g.io == CUDNN_DATA_HALF ? " f16" : " bf16");
}

// The shape's entry, made on first use unless the caller is inside a captured step (planning
// may compile and allocate; the eager warm-up steps before a capture plan every shape the step
// has): null then. Caller holds the mutex.
PlannedAttention* entry_for(CudnnAttentionState& st, const CudnnAttentionGeometry& geo) {
  int64_t rate_bits = 0;
  std::memcpy(&rate_bits, &geo.dropout_rate, sizeof(rate_bits));
  std::vector<int64_t> key = {int64_t(geo.io), geo.batch, geo.heads, geo.kv_heads, geo.tq, geo.tk, geo.d,
                              int64_t(geo.causal), rate_bits};
  key.insert(key.end(), {int64_t(geo.key_bias), geo.key_bias ? geo.bias_batches : 0});
  for (const auto* strides : {&geo.q_strides, &geo.k_strides, &geo.v_strides, &geo.o_strides})
    key.insert(key.end(), strides->begin(), strides->end());
  const bool capturing = capturing_on_this_thread();
  auto it = st.plans.find(key);
  if (it == st.plans.end()) {
    if (capturing) return nullptr;
    while (st.plans.size() >= kMaxPlans) {  // the one unused longest goes, unless captured
      auto oldest = st.plans.end();
      for (auto o = st.plans.begin(); o != st.plans.end(); ++o)
        if (!o->second->captured && (oldest == st.plans.end() || o->second->last_used < oldest->second->last_used))
          oldest = o;
      if (oldest == st.plans.end()) break;
      // Its kernels may still be queued, and a plan may own the code they run (the engines
      // compiled at run time): the stream drains first. Only a run meeting more than
      // kMaxPlans shapes (a server) waits here, never inside a captured step.
      check(cudaStreamSynchronize(stream()), "cudnn attention plan eviction");
      st.plans.erase(oldest);
    }
    it = st.plans.emplace(std::move(key), std::make_unique<PlannedAttention>()).first;
  }
  it->second->last_used = ++st.clock;
  if (capturing) it->second->captured = true;
  return it->second.get();
}

// The entry's direction with its plan, made on first use outside captures (null: refused, or
// not yet made inside a capture). Caller holds the mutex.
const PlannedAttention::Direction* planned(CudnnAttentionState& st, PlannedAttention& entry,
                                           const CudnnAttentionGeometry& geo, bool backward) {
  PlannedAttention::Direction& d = backward ? entry.backward : entry.forward;
  if (!d.tried) {
    if (capturing_on_this_thread()) return nullptr;
    d.tried = true;
    const std::string what = std::string("attention ") + (backward ? "backward" : "forward");
    auto attempt = [&](const CudnnAttentionGeometry& g) {
      d.plan = cudnn_graph::Plan{};  // before the graph whose operations it names
      d.graph = cudnn_graph::Graph{};
      try {
        if (backward)
          build_cudnn_attention_backward(d.graph, g);
        else
          build_cudnn_attention_forward(d.graph, g);
        d.plan = cudnn_graph::make_plan(st.handle, d.graph, what);
      } catch (const std::exception& e) {
        d.plan = cudnn_graph::Plan{};
        d.plan.refusal = e.what();
      }
    };
    const auto planning_started = std::chrono::steady_clock::now();
    attempt(geo);
    // The mask's bias read with a 0 stride over the rows is how PyTorch hands cuDNN an expanded
    // mask; should this cuDNN refuse it, the rows written out (Tq times the bytes, at every call:
    // not past kMaxWrittenBiasBytes).
    const int64_t written_bytes = geo.bias_batches * geo.tq * geo.tk * 2;
    if (!d.plan.plan && geo.key_bias && written_bytes <= kMaxWrittenBiasBytes) {
      const std::string zero_stride_refusal = d.plan.refusal;
      CudnnAttentionGeometry written = geo;
      written.bias_rows_written = true;
      attempt(written);
      d.bias_rows_written = d.plan.plan != nullptr;
      if (d.plan.plan)
        std::cerr << "[cudnn attention] the " << what << " of " << describe(geo) << " reads its key mask's bias "
                  << "row by row: cuDNN refused it with a 0 stride over the rows (" << zero_stride_refusal << ")\n";
      else
        d.plan.refusal = "with the key mask's bias read with a 0 stride over the rows: " + zero_stride_refusal +
                         "; with its rows written out: " + d.plan.refusal;
    }
    if (!d.plan.plan) {
      st.last_refusal = what + " " + describe(geo) + ": " + d.plan.refusal;
      std::cerr << "[cudnn attention] not taken for the " << st.last_refusal
                << "; the attention kernels of this build run it\n";
    } else {
      // Planning may compile the engine's kernels (NVRTC): seconds a new shape waits, which a
      // run should be able to see. Said for the first plan (logs and tests look for that line:
      // the opt-in route is in use) and for any that took a second or more.
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - planning_started).count();
      if (!st.announced || ms >= 1000) {
        std::cerr << "[cudnn attention] cuDNN " << st.version << (st.announced ? " planned" : " runs") << " the "
                  << what << " of " << describe(geo) << " (planned in " << int64_t(ms) << " ms, "
                  << d.plan.workspace_bytes << " bytes of workspace)\n";
        st.announced = true;
      }
    }
  }
  return d.plan.plan ? &d : nullptr;
}

// Device memory of `bytes` (none for 0), from the arrays' pool.
Array device_buffer(int64_t bytes, Device device) {
  return bytes > 0 ? Array::empty({(bytes + 3) / 4}, DType::i32, device) : Array();
}

void run(CudnnAttentionState& st, const cudnn_graph::Plan& plan, const CudnnAttentionGeometry& geo, Device device,
         std::vector<int64_t> uids, std::vector<void*> pointers, const std::string& what) {
  float mask_value = st.mask_value;
  if (geo.causal) {
    uids.push_back(kCudnnMaskValue);
    pointers.push_back(&mask_value);
  }
  const Array workspace = device_buffer(plan.workspace_bytes, device);
  const cudnnStatus_t status = cudnn().SetStream(st.handle, stream());
  MT_CHECK(status == CUDNN_STATUS_SUCCESS, "[cudnn attention] cudnnSetStream: ", cudnn_graph::status_text(status));
  // The shape is named only when something fails: describe() is not built at every call.
  try {
    cudnn_graph::execute(st.handle, plan, uids, pointers, workspace.defined() ? workspace.raw() : nullptr, what);
  } catch (const Error& e) {
    throw Error(detail::concat(e.what(), " (", describe(geo), ")"));
  }
}

// A dropout graph's seed and offset (device memory: `seed_offset`, [0] and [2]) and its scale
// 1 / (1 - rate) (the host's `scale`, by value), appended to its variant pack.
void append_dropout(const kernels::FlashAttentionShape& s, const Array& seed_offset, float& scale,
                    std::vector<int64_t>& uids, std::vector<void*>& pointers) {
  scale = float(1.0 / (1.0 - s.dropout_rate));
  uids.insert(uids.end(), {kCudnnSeed, kCudnnOffset, kCudnnDropoutScale});
  pointers.insert(pointers.end(), {seed_offset.raw(), static_cast<int64_t*>(seed_offset.raw()) + 2, &scale});
}

// A key mask's bias and the batches whose mask row unmasks no key (cudnn_key_mask_bias), made
// on the stream; empty without a mask.
struct KeyMaskBias {
  Array bias, no_visible_key;
  const int32_t* flags() const { return static_cast<const int32_t*>(no_visible_key.raw()); }
};

KeyMaskBias key_mask_bias(const kernels::FlashAttentionShape& s, const CudnnAttentionGeometry& geo,
                          const PlannedAttention::Direction& plan, Device device, std::vector<int64_t>& uids,
                          std::vector<void*>& pointers) {
  if (!s.key_mask) return {};
  const int64_t rows = plan.bias_rows_written ? s.tq : 1;
  KeyMaskBias m{Array::empty({s.mask_batches, rows, s.tk}, DType::bf16, device),
                Array::empty({geo.batch}, DType::i32, device)};
  cudnn_key_mask_bias(s.key_mask, s.mask_batches, s.tk, rows, m.bias, m.no_visible_key);
  uids.push_back(kCudnnBias);
  pointers.push_back(m.bias.raw());
  return m;
}

// cuDNN up to 9.15.0 reads out of bounds in the backward replayed from a captured CUDA graph
// where Tk is not a multiple of 128 and no padding mask is set (fixed in 9.15.1; its frontend
// works around it with a padding mask of full lengths): such calls run on the kernels inside
// captures. With dropout the forward, which decides for both, asks too.
bool replay_bug_applies(const CudnnAttentionState& st, const kernels::FlashAttentionShape& s) {
  return st.version <= 91500 && s.tk % 128 != 0 && capturing_on_this_thread();
}

// The batches cuDNN's bias cannot serve run on the tensor-core kernels (on the device's verdict),
// which a key mask therefore needs here too.
const char* const kKeyMaskNeedsTensorCores =
    "a key-padding mask where the tensor-core kernels, which take its batches with no visible key, do not run";

const char* route_name(MeasuredRoute::Route r) { return r == MeasuredRoute::second ? "cuDNN" : "the kernels"; }

// Waits for the trial's timed calls, hands their times to its MeasuredRoute, and says the
// choice (stderr, and cudnn_attention_measured_choices). Caller holds the mutex.
void collect(CudnnAttentionState& st, RouteTiming& t, const std::string& what, const CudnnAttentionGeometry& geo) {
  const std::vector<RouteTiming::Pending> pending = std::exchange(t.pending, {});
  try {
    for (const RouteTiming::Pending& p : pending) t.route.report(p.route, p.events.elapsed_ms());
  } catch (...) {
    t.route.restart();
    throw;
  }
  // A call of the trial failed before it was timed (an error its caller caught): measure again.
  if (!t.route.decided()) t.route.restart();
  if (!t.route.decided()) return;
  const std::string line = detail::concat(
      what, " of ", describe(geo), ": ", route_name(t.route.choice()), " (median of ", t.route.timed_calls() / 2,
      " calls: cuDNN ", t.route.median_ms(MeasuredRoute::second), " ms, the kernels ",
      t.route.median_ms(MeasuredRoute::first), " ms)");
  st.measured_choices.push_back(line);
  std::cerr << "[cudnn attention] auto: the " << line << "\n";
}

// MT_ATTENTION_CUDNN=auto: runs the call on the route its trial gives, timed while the trial
// lasts, then on the trial's choice. Inside a captured step nothing is timed and a shape still
// undecided keeps the kernels (the graph replays them). Caller holds the mutex.
template <class OnCudnn, class OnKernels>
void run_measured(CudnnAttentionState& st, RouteTiming& t, const std::string& what, const CudnnAttentionGeometry& geo,
                  OnCudnn&& on_cudnn, OnKernels&& on_kernels) {
  MeasuredRoute::Call call{MeasuredRoute::first, false};
  if (capturing_on_this_thread()) {
    if (t.route.decided()) call.route = t.route.choice();
  } else {
    if (t.route.awaiting_times()) collect(st, t, what, geo);
    call = t.route.next();
  }
  std::optional<TimingEvents> timer;
  if (call.timed) {
    timer.emplace("cudnn attention auto: timing a call");
    timer->start(stream());
  }
  if (call.route == MeasuredRoute::second)
    on_cudnn();
  else
    on_kernels();
  if (timer) {
    timer->stop(stream());
    t.pending.push_back({call.route, std::move(*timer)});
  }
}

}  // namespace

bool cudnn_attention_forward(const Array& q, const Array& k, const Array& v, const kernels::FlashAttentionShape& s,
                             Array& out, Array& lse) {
  const CudnnAttentionMode mode = cudnn_attention_mode();
  if (mode == CudnnAttentionMode::off || !cudnn_attention_ineligibility(q, k, v, out, s, mode).empty()) return false;
  const bool dropout = s.dropout_rate > 0;
  // With dropout the backward must be handed the mask's seed (the op keeps the record).
  if (dropout && !s.cudnn_dropout_record) return false;
  const CudnnAttentionGeometry geo = cudnn_attention_geometry(q.dtype(), s);
  CudnnAttentionState& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  if (!ready(st)) return false;
  if (s.key_mask && !flash_attention_tensor_cores(q, s.d)) {
    st.last_refusal = kKeyMaskNeedsTensorCores;
    return false;
  }
  if (dropout && replay_bug_applies(st, s)) return false;
  PlannedAttention* entry = entry_for(st, geo);
  const PlannedAttention::Direction* plan = entry ? planned(st, *entry, geo, false) : nullptr;
  // With dropout the backward must draw the same mask: both directions on cuDNN, or neither.
  if (!plan || (dropout && !planned(st, *entry, geo, true))) return false;
  float scale = s.scale, dropout_scale = 1.0f;
  std::vector<int64_t> uids = {kCudnnQ, kCudnnK, kCudnnV, kCudnnO, kCudnnStats, kCudnnScale};
  std::vector<void*> pointers = {q.raw(), k.raw(), v.raw(), out.raw(), lse.raw(), &scale};
  if (dropout) {
    Array seed_offset = Array::empty({4}, DType::i64, q.device());
    cudnn_dropout_seed(s.dropout_key, seed_offset);
    append_dropout(s, seed_offset, dropout_scale, uids, pointers);
    *s.cudnn_dropout_record = seed_offset;  // the backward draws the mask again from it
  }
  auto on_cudnn = [&] {
    const KeyMaskBias mask = key_mask_bias(s, geo, *plan, q.device(), uids, pointers);
    run(st, plan->plan, geo, q.device(), std::move(uids), std::move(pointers), "attention forward");
    if (s.key_mask) flash_attention_forward_tc(q, k, v, s, out, lse, mask.flags());
    ++st.forwards;
  };
  if (mode == CudnnAttentionMode::measured && flash_attention_tensor_cores(q, s.d))
    run_measured(st, entry->forward.timing, "attention forward", geo, on_cudnn,
                 [&] { flash_attention_forward_tc(q, k, v, s, out, lse); });
  else
    on_cudnn();
  return true;
}

bool cudnn_attention_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                              const Array& g, const kernels::FlashAttentionShape& s, Array& dq, Array& dk, Array& dv) {
  // With dropout the forward decided: a recorded seed means cuDNN drew the mask and must draw
  // it again here (the kernels of this build cannot); none means dropout()'s mask, which only
  // they draw. Without dropout either backward takes either forward.
  const bool dropout = s.dropout_rate > 0;
  const bool follows = s.cudnn_dropout_seed && s.cudnn_dropout_seed->defined();
  if (dropout && !follows) return false;
  const auto must = [&](bool ok, const std::string& why) {
    MT_CHECK(ok || !follows, "[cudnn attention] the forward drew cuDNN's dropout mask, but its backward cannot run "
             "on cuDNN (", why, "), and the attention kernels of this build cannot draw that mask again");
    return ok;
  };
  const CudnnAttentionMode mode = follows ? CudnnAttentionMode::all : cudnn_attention_mode();
  if (!follows) {
    if (mode == CudnnAttentionMode::off || !cudnn_attention_ineligibility(q, k, v, out, s, mode).empty()) return false;
  } else {
    const std::string why = cudnn_attention_ineligibility(q, k, v, out, s, CudnnAttentionMode::all);
    must(why.empty(), why);
  }
  for (const Array* a :
       {&g, static_cast<const Array*>(&dq), static_cast<const Array*>(&dk), static_cast<const Array*>(&dv)})
    if (!must(reinterpret_cast<uintptr_t>(a->raw()) % 16 == 0, "a gradient array is not 16-byte aligned")) return false;
  const CudnnAttentionGeometry geo = cudnn_attention_geometry(q.dtype(), s);
  CudnnAttentionState& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  if (!must(ready(st), "cuDNN is unavailable")) return false;
  if (s.key_mask && !must(flash_attention_tensor_cores(q, s.d), kKeyMaskNeedsTensorCores)) return false;
  if (!must(!replay_bug_applies(st, s), "cuDNN " + std::to_string(st.version) + "'s backward replayed from a " +
            "captured graph reads out of bounds where Tk is not a multiple of 128")) return false;
  PlannedAttention* entry = entry_for(st, geo);
  const PlannedAttention::Direction* plan = entry ? planned(st, *entry, geo, true) : nullptr;
  if (!must(plan != nullptr, "no plan for its shape: " + st.last_refusal)) return false;
  auto on_cudnn = [&] {
    // The graph's two f32 buffers: the rows' Σ dO·O, and dQ accumulated before its rounding
    // (cuDNN before 9.6 accumulates into it as it finds it: zeroed there).
    const int64_t rows = geo.batch * geo.heads * geo.tq;
    const Array softmax_sum = device_buffer(rows * 4, q.device());
    const Array dq_accum = device_buffer(rows * geo.d * 4, q.device());
    if (st.version < 90600)
      check(cudaMemsetAsync(dq_accum.raw(), 0, size_t(rows * geo.d * 4), stream()), "cudnn attention backward");
    // With dropout the softmax sum is scaled by (1 - rate) where it is by 1 otherwise.
    float scale = s.scale, one = dropout ? float(1.0 - s.dropout_rate) : 1.0f, dropout_scale = 1.0f;
    std::vector<int64_t> uids = {kCudnnQ,  kCudnnK,  kCudnnV,          kCudnnO,       kCudnnDO,    kCudnnStats,
                                 kCudnnDQ, kCudnnDK, kCudnnDV,         kCudnnSoftmaxSum, kCudnnDqAccum, kCudnnScale,
                                 kCudnnOne};
    std::vector<void*> pointers = {q.raw(),  k.raw(),  v.raw(),  out.raw(),         g.raw(),         lse.raw(), dq.raw(),
                                   dk.raw(), dv.raw(), softmax_sum.raw(), dq_accum.raw(), &scale,   &one};
    if (dropout) append_dropout(s, *s.cudnn_dropout_seed, dropout_scale, uids, pointers);
    const KeyMaskBias mask = key_mask_bias(s, geo, *plan, q.device(), uids, pointers);
    run(st, plan->plan, geo, q.device(), std::move(uids), std::move(pointers), "attention backward");
    if (s.key_mask) flash_attention_backward_tc(q, k, v, out, lse, g, s, dq, dk, dv, mask.flags());
    ++st.backwards;
  };
  if (mode == CudnnAttentionMode::measured && flash_attention_tensor_cores(q, s.d))
    run_measured(st, entry->backward.timing, "attention backward", geo, on_cudnn,
                 [&] { flash_attention_backward_tc(q, k, v, out, lse, g, s, dq, dk, dv); });
  else
    on_cudnn();
  return true;
}

uint64_t cudnn_attention_forwards() {
  CudnnAttentionState& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.forwards;
}

uint64_t cudnn_attention_backwards() {
  CudnnAttentionState& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.backwards;
}

std::string cudnn_attention_measured_choices() {
  CudnnAttentionState& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::string lines;
  for (const std::string& line : st.measured_choices) lines += line + "\n";
  return lines;
}

std::string cudnn_attention_last_refusal() {
  CudnnAttentionState& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  return !st.unavailable.empty() ? "cuDNN is unavailable: " + st.unavailable : st.last_refusal;
}

}  // namespace mt::cuda
