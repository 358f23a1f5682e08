#include "meshtrain/backend/cpu/matmul_plans.h"

#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/core/error.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_debug.h>

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>

namespace mt::cpu::matmul_plans {

using kernels::MatmulDType;

namespace {

// ---------------------------------------------------------------------------------------
// Global oneDNN state. Heap-allocated and never freed so thread_local caches that outlive
// static destruction at exit never touch a dead engine.
// ---------------------------------------------------------------------------------------

// oneDNN's jit GEMM (dnnl_sgemm) mallocs its packing buffers on every call. With glibc's
// defaults those come from fresh mmaps or from heap tops trimmed after the previous call, so
// each training step took ~21,000 minor page faults (GPT-2 B4 T256) and zeroed those pages
// again. A fixed mmap threshold (the largest glibc allows, 32 MiB) and no trimming keep freed
// buffers in the heaps for the next call; the engine's own arrays come from the caching
// allocator and are not affected.
void keep_malloc_heaps() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

// oneDNN keeps a cache of its own (1024 primitives by default) holding the same primitives as
// ours, which kept every dropped plan alive: 2000 product shapes under a 256-plan cap still
// grew RSS by 109 MB, 31 MB with it off. Ours is the one cache, unless the user sized oneDNN's.
void no_second_primitive_cache() {
  if (!std::getenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY") && !std::getenv("DNNL_PRIMITIVE_CACHE_CAPACITY"))
    dnnl::set_primitive_cache_capacity(0);
}

dnnl::engine& cpu_engine() {
  // cpu_features() first: it applies the instruction-set cap before oneDNN reads it.
  static auto* engine = (cpu_features(), keep_malloc_heaps(), no_second_primitive_cache(),
                         new dnnl::engine(dnnl::engine::kind::cpu, 0));
  return *engine;
}

// With the OpenMP runtime a CPU stream carries no per-execution state, so one stream can be
// shared by every calling thread.
dnnl::stream& cpu_stream() {
  static auto* stream = new dnnl::stream(cpu_engine());
  return *stream;
}

const char* dtype_name(MatmulDType dtype) {
  switch (dtype) {
    case MatmulDType::f32: return "f32";
    case MatmulDType::bf16: return "bf16";
    case MatmulDType::f16: return "f16";
    case MatmulDType::bf16_f32: return "bf16->f32";
    case MatmulDType::f32_as_bf16: return "f32 as bf16";
    case MatmulDType::f32_as_tf32: return "f32 as tf32";
  }
  return "?";
}

dnnl::memory::data_type to_dnnl(MatmulDType dtype) {
  switch (dtype) {
    case MatmulDType::f32: return dnnl::memory::data_type::f32;
    case MatmulDType::bf16: return dnnl::memory::data_type::bf16;
    case MatmulDType::f16: return dnnl::memory::data_type::f16;
    case MatmulDType::bf16_f32: return dnnl::memory::data_type::bf16;
    case MatmulDType::f32_as_bf16: break;  // never reaches oneDNN: matmul rounds it first
    case MatmulDType::f32_as_tf32: break;  // never reaches oneDNN: matmul runs it as f32
  }
  return dnnl::memory::data_type::undef;
}
dnnl::memory::data_type to_dnnl_out(MatmulDType dtype) {
  return dtype == MatmulDType::bf16_f32 ? dnnl::memory::data_type::f32 : to_dnnl(dtype);
}

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const noexcept {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    auto mix = [&h](uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdull;
    };
    mix(uint64_t(k.dtype) | uint64_t(k.trans_a) << 8 | uint64_t(k.trans_b) << 9 |
        uint64_t(k.accumulate) << 10);
    mix(uint64_t(k.batch));
    mix(uint64_t(k.batch_a));
    mix(uint64_t(k.batch_b));
    mix(uint64_t(k.M));
    mix(uint64_t(k.N));
    mix(uint64_t(k.K));
    return size_t(h ^ (h >> 31));
  }
};

std::atomic<int64_t> plans_alive{0};
std::atomic<uint64_t> plans_created{0};

// A created primitive and the descriptors used to wrap user pointers; immutable once built,
// so it is shared between threads.
struct Plan {
  Plan() {
    plans_alive.fetch_add(1, std::memory_order_relaxed);
    plans_created.fetch_add(1, std::memory_order_relaxed);
  }
  ~Plan() { plans_alive.fetch_sub(1, std::memory_order_relaxed); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md, scratch_md;
  size_t scratch_bytes = 0;
};

std::shared_ptr<const Plan> make_plan(const PlanKey& k) {
  using dims = dnnl::memory::dims;
  const auto dt = to_dnnl(k.dtype);
  // Transposed operands are the same buffers read with swapped inner strides: no copies.
  const dnnl::memory::desc a_md({k.batch_a, k.M, k.K}, dt,
                                k.trans_a ? dims{k.M * k.K, 1, k.M} : dims{k.M * k.K, k.K, 1});
  const dnnl::memory::desc b_md({k.batch_b, k.K, k.N}, dt,
                                k.trans_b ? dims{k.K * k.N, 1, k.K} : dims{k.K * k.N, k.N, 1});
  const dnnl::memory::desc c_md({k.batch, k.M, k.N}, to_dnnl_out(k.dtype), dims{k.M * k.N, k.N, 1});

  dnnl::primitive_attr attr;
  // User scratchpad lets a cached primitive run on any thread (the library-managed global
  // scratchpad ties a primitive to its creating thread).
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // beta = 1
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr,
                                        cpu_engine());
  auto plan = std::make_shared<Plan>();
  plan->prim = dnnl::matmul(pd);
  plan->a_md = pd.src_desc();
  plan->b_md = pd.weights_desc();
  plan->c_md = pd.dst_desc();
  plan->scratch_md = pd.scratchpad_desc();
  plan->scratch_bytes = plan->scratch_md.get_size();
  return plan;
}

// A cached plan with what the eviction needs: when it was last used, and whether it has been
// dropped (threads holding it then let it go).
struct Entry {
  Entry(std::shared_ptr<const Plan> p, uint64_t now) : plan(std::move(p)), last_used(now) {}
  const std::shared_ptr<const Plan> plan;
  std::atomic<uint64_t> last_used;
  std::atomic<bool> dropped{false};
};

// Process-wide cache: primitive creation (JIT) is expensive, so threads share plans.
struct SharedPlans {
  std::shared_mutex mu;
  std::unordered_map<PlanKey, std::shared_ptr<Entry>, PlanKeyHash> entries;
  // Advanced by each plan created, so "last used" reads "since the n-th creation": a hit
  // stores only when a creation happened since its plan's last use, and eviction, which only
  // a creation starts, still finds the plan unused longest.
  std::atomic<uint64_t> clock{1};
  std::atomic<uint64_t> drops{0};  // evictions and clears so far: a thread that sees it change purges
  std::atomic<size_t> capacity{kernels::matmul_plan_capacity_from_env()};
};

SharedPlans& shared_plans() {
  static auto* cache = new SharedPlans;
  return *cache;
}

void touch(Entry& e, uint64_t now) {
  if (e.last_used.load(std::memory_order_relaxed) != now) e.last_used.store(now, std::memory_order_relaxed);
}

// Drops the least recently used plans (never `keep`) until the cache is within capacity.
// Caller holds the unique lock.
void evict_beyond_capacity(SharedPlans& sp, const Entry* keep) {
  while (sp.entries.size() > sp.capacity.load(std::memory_order_relaxed)) {
    auto oldest = sp.entries.end();
    for (auto it = sp.entries.begin(); it != sp.entries.end(); ++it) {
      if (it->second.get() == keep) continue;
      if (oldest == sp.entries.end() ||
          it->second->last_used.load(std::memory_order_relaxed) <
              oldest->second->last_used.load(std::memory_order_relaxed))
        oldest = it;
    }
    if (oldest == sp.entries.end()) return;
    oldest->second->dropped.store(true, std::memory_order_relaxed);
    sp.entries.erase(oldest);
    sp.drops.fetch_add(1, std::memory_order_release);  // after `dropped`: a thread seeing it sees that
  }
}

std::shared_ptr<Entry> find_or_create(const PlanKey& key) {
  auto& sp = shared_plans();
  {
    std::shared_lock lock(sp.mu);
    if (auto it = sp.entries.find(key); it != sp.entries.end()) {
      touch(*it->second, sp.clock.load(std::memory_order_relaxed));
      return it->second;
    }
  }
  // Create outside the lock so a slow JIT does not block other shapes; a racing thread may
  // build the same plan, and the first one inserted wins.
  auto entry = std::make_shared<Entry>(make_plan(key), 0);
  std::unique_lock lock(sp.mu);
  auto [it, inserted] = sp.entries.try_emplace(key, entry);
  if (!inserted) {
    touch(*it->second, sp.clock.load(std::memory_order_relaxed));
    return it->second;
  }
  entry->last_used.store(sp.clock.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  evict_beyond_capacity(sp, entry.get());
  return entry;
}

// Per-thread memory objects for one plan. Rebinding via set_data_handle is ~40x cheaper than
// creating memory objects per call, but is only safe on objects no other thread touches.
struct ThreadSlot {
  std::shared_ptr<Entry> entry;
  dnnl::memory a, b, c, scratch;
};

struct FreeDeleter {
  void operator()(void* p) const noexcept { std::free(p); }
};

// A thread's slots are the cache's plans it has run: it lets go of dropped ones at its next
// matmul, so it holds no more than the cache does.
struct ThreadPlans {
  uint64_t drops_seen = 0;
  std::unordered_map<PlanKey, ThreadSlot, PlanKeyHash> slots;
  std::unique_ptr<void, FreeDeleter> scratch;  // grown to the largest plan run on this thread
  size_t scratch_cap = 0;
};

ThreadPlans& thread_plans() {
  thread_local ThreadPlans plans;
  return plans;
}

// The thread lets go of the plans the cache has dropped since it last looked.
void let_go_of_dropped(ThreadPlans& tp, const SharedPlans& sp) {
  const uint64_t drops = sp.drops.load(std::memory_order_acquire);
  if (tp.drops_seen == drops) return;
  tp.drops_seen = drops;
  std::erase_if(tp.slots, [](const auto& kv) { return kv.second.entry->dropped.load(std::memory_order_relaxed); });
}

ThreadSlot& get_slot(const PlanKey& key) {
  auto& sp = shared_plans();
  auto& tp = thread_plans();
  let_go_of_dropped(tp, sp);
  if (auto it = tp.slots.find(key); it != tp.slots.end()) {
    touch(*it->second.entry, sp.clock.load(std::memory_order_relaxed));
    return it->second;
  }
  ThreadSlot slot;
  slot.entry = find_or_create(key);
  let_go_of_dropped(tp, sp);  // the creation may just have dropped one
  const Plan& plan = *slot.entry->plan;
  const auto& eng = cpu_engine();
  slot.a = dnnl::memory(plan.a_md, eng, nullptr);
  slot.b = dnnl::memory(plan.b_md, eng, nullptr);
  slot.c = dnnl::memory(plan.c_md, eng, nullptr);
  if (plan.scratch_bytes > 0) slot.scratch = dnnl::memory(plan.scratch_md, eng, nullptr);
  return tp.slots.emplace(key, std::move(slot)).first->second;
}

void* thread_scratch(size_t bytes) {
  auto& tp = thread_plans();
  if (bytes > tp.scratch_cap) {
    const size_t cap = (bytes + 4095) & ~size_t(4095);
    void* p = std::aligned_alloc(4096, cap);
    if (!p) throw std::bad_alloc();
    tp.scratch.reset(p);
    tp.scratch_cap = cap;
  }
  return tp.scratch.get();
}

void execute(ThreadSlot& slot, const PlanKey& key, const void* a, const void* b, void* c) {
  const Plan& plan = *slot.entry->plan;
  slot.a.set_data_handle(const_cast<void*>(a));
  slot.b.set_data_handle(const_cast<void*>(b));
  slot.c.set_data_handle(c);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, slot.a.get()},
                             {DNNL_ARG_WEIGHTS, slot.b.get()},
                             {DNNL_ARG_DST, slot.c.get()},
                             {DNNL_ARG_SCRATCHPAD, nullptr}};
  int nargs = 3;
  if (plan.scratch_bytes > 0) {
    slot.scratch.set_data_handle(thread_scratch(plan.scratch_bytes));
    args[3].memory = slot.scratch.get();
    nargs = 4;
  }
  // The C entry point takes a stack array; the C++ one builds an unordered_map per call.
  const dnnl_status_t st = dnnl_primitive_execute(plan.prim.get(), cpu_stream().get(), nargs, args);
  if (st != dnnl_success) {
    throw Error(detail::concat("[matmul] oneDNN execute failed (", dnnl_status2str(st),
                               ") for ", describe(key)));
  }
}

}  // namespace

std::string describe(const PlanKey& k) {
  std::ostringstream os;
  os << "dtype=" << dtype_name(k.dtype) << " batch=" << k.batch << " batch_a=" << k.batch_a
     << " batch_b=" << k.batch_b << " M=" << k.M << " N=" << k.N << " K=" << k.K
     << " trans_a=" << k.trans_a << " trans_b=" << k.trans_b << " accumulate=" << k.accumulate;
  return os.str();
}

void init_onednn() { cpu_engine(); }

void run(const PlanKey& key, const void* a, const void* b, void* c) {
  ThreadSlot* slot = nullptr;
  try {
    slot = &get_slot(key);
  } catch (const dnnl::error& e) {
    throw Error(detail::concat("[matmul] oneDNN could not create primitive for ", describe(key), ": ", e.what()));
  }
  execute(*slot, key, a, b, c);
}

size_t cached() {
  auto& sp = shared_plans();
  std::shared_lock lock(sp.mu);
  return sp.entries.size();
}

size_t alive() { return size_t(plans_alive.load(std::memory_order_relaxed)); }
uint64_t created() { return plans_created.load(std::memory_order_relaxed); }

void clear() {
  auto& sp = shared_plans();
  std::unique_lock lock(sp.mu);
  for (auto& kv : sp.entries) kv.second->dropped.store(true, std::memory_order_relaxed);
  sp.entries.clear();
  sp.drops.fetch_add(1, std::memory_order_release);
}

size_t set_capacity(size_t plans) {
  MT_CHECK(plans >= 1, "[matmul] the plan cache must hold at least one plan");
  auto& sp = shared_plans();
  std::unique_lock lock(sp.mu);
  const size_t previous = sp.capacity.exchange(plans);
  evict_beyond_capacity(sp, nullptr);
  return previous;
}

}  // namespace mt::cpu::matmul_plans
