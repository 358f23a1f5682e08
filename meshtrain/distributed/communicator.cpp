#include "meshtrain/distributed/communicator.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/local_communicator.h"
#include "meshtrain/distributed/mpi_communicator.h"
#include "meshtrain/distributed/mpi_runtime.h"
#include "meshtrain/distributed/nccl_communicator.h"

namespace mt::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
  }
  return "?";
}

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_to_all: return "all_to_all";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
  }
  return "?";
}

const CollectiveCount& CommStats::operator[](CollectiveKind kind) const {
  switch (kind) {
    case CollectiveKind::all_reduce: return all_reduce;
    case CollectiveKind::all_gather: return all_gather;
    case CollectiveKind::reduce_scatter: return reduce_scatter;
    case CollectiveKind::all_to_all: return all_to_all;
    case CollectiveKind::broadcast: return broadcast;
    case CollectiveKind::barrier: return barrier;
  }
  throw Error("[comm] invalid collective kind");
}

CollectiveCount& CommStats::operator[](CollectiveKind kind) {
  return const_cast<CollectiveCount&>(static_cast<const CommStats&>(*this)[kind]);
}

namespace {
constexpr CollectiveKind kAllKinds[] = {CollectiveKind::all_reduce, CollectiveKind::all_gather,
                                        CollectiveKind::reduce_scatter, CollectiveKind::all_to_all,
                                        CollectiveKind::broadcast, CollectiveKind::barrier};

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}
}  // namespace

int64_t CommStats::total_calls() const {
  int64_t n = 0;
  for (CollectiveKind k : kAllKinds) n += (*this)[k].calls;
  return n;
}

int64_t CommStats::total_bytes() const {
  int64_t n = 0;
  for (CollectiveKind k : kAllKinds) n += (*this)[k].bytes;
  return n;
}

std::string CommStats::str() const {
  std::string out;
  for (CollectiveKind k : kAllKinds) {
    const CollectiveCount& c = (*this)[k];
    if (c.calls == 0) continue;
    if (!out.empty()) out += "; ";
    out += ::mt::detail::concat(collective_name(k), ": ", c.calls, c.calls == 1 ? " call" : " calls");
    if (k != CollectiveKind::barrier) out += ", " + format_bytes(c.bytes);
  }
  return out.empty() ? "no collectives" : out;
}

namespace {
thread_local bool t_blocking = false;
thread_local bool t_uncounted = false;
}  // namespace

Communicator::Uncounted::Uncounted() : previous_(t_uncounted) { t_uncounted = true; }
Communicator::Uncounted::~Uncounted() { t_uncounted = previous_; }

void Communicator::check_and_count(CollectiveKind kind, const void* send, const void* recv, int64_t count,
                                   DType dtype, int root) {
  const char* op = collective_name(kind);
  MT_CHECK(count >= 0, "[comm] ", op, " on '", name_, "': negative count ", count);
  const int64_t blocks = (kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_to_all ||
                          kind == CollectiveKind::all_gather)
                             ? size()
                             : 1;
  // MPI counts are C ints; one collective never moves more than that many elements per buffer.
  MT_CHECK(count * blocks <= INT_MAX, "[comm] ", op, " on '", name_, "': ", count, " x ", blocks,
           " elements exceed the limit of ", INT_MAX, " per collective; split the buffer");
  if (kind == CollectiveKind::broadcast)
    MT_CHECK(root >= 0 && root < size(), "[comm] broadcast on '", name_, "' (size ", size(), "): root ", root,
             " out of range [0, ", size(), ")");
  if (count > 0 && kind != CollectiveKind::barrier) {
    MT_CHECK(send != nullptr, "[comm] ", op, " on '", name_, "': null ",
             recv ? "send" : "data", " buffer for ", count, " ", dtype_name(dtype), " elements");
    if (recv != send)
      MT_CHECK(recv != nullptr, "[comm] ", op, " on '", name_, "': null recv buffer for ", count, " ",
               dtype_name(dtype), " elements");
  }
  int64_t bytes = 0;
  if (kind != CollectiveKind::barrier) {
    const bool whole_send = kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_to_all;
    bytes = count * int64_t(dtype_size(dtype)) * (whole_send ? size() : 1);
  }
  if (t_uncounted) return;
  std::lock_guard<std::mutex> lock(stats_mu_);
  CollectiveCount& c = stats_[kind];
  c.calls += 1;
  c.bytes += bytes;
}

Communicator* Communicator::device_communicator(Device device) {
  if (size() == 1) return nullptr;  // nothing to move: decided alike on every rank, silently
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_decided_) {
    device_decided_ = true;  // also when deciding fails: a rank must never decide again alone
    Uncounted setup;
    try {
      // A rank asking for CPU arrays speaks for the GPU its process uses, if any, so one
      // early host collective does not rule NCCL out for the GPU arrays that follow.
      device_comm_ = make_nccl_communicator(*this, device.is_cuda() ? device : default_device(), &device_status_);
    } catch (const std::exception& e) {
      device_status_ = e.what();
      throw;
    }
  }
  if (!device.is_cuda() || !device_comm_) return nullptr;
  return device_comm_.get();
}

std::string Communicator::device_communicator_status() const {
  if (size() == 1) return "one rank: collectives move nothing";
  std::lock_guard<std::mutex> lock(device_mu_);
  if (!device_decided_) return "not yet asked for";
  return device_comm_ ? "NCCL over " + std::to_string(device_comm_->size()) + " GPUs" : device_status_;
}

CommStats Communicator::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void Communicator::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = CommStats{};
}

Communicator::BlockingCall::BlockingCall() : previous_(t_blocking) { t_blocking = true; }
Communicator::BlockingCall::~BlockingCall() { t_blocking = previous_; }
bool Communicator::in_blocking_call() { return t_blocking; }

void Communicator::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  BlockingCall blocking;
  all_reduce_async(data, count, dtype, op).wait();
}
void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  BlockingCall blocking;
  all_gather_async(send, recv, count, dtype).wait();
}
void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  BlockingCall blocking;
  reduce_scatter_async(send, recv, count, dtype, op).wait();
}
void Communicator::all_to_all(const void* send, void* recv, int64_t count, DType dtype) {
  BlockingCall blocking;
  all_to_all_async(send, recv, count, dtype).wait();
}
void Communicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  BlockingCall blocking;
  broadcast_async(data, count, dtype, root).wait();
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_SIZE");
}

Communicator& world() {
  // Deliberately leaked: communicators and meshes may be destroyed during static destruction
  // in any order; MPI itself is finalized by the runtime's exit handler.
  static Communicator* const w = launched_by_mpi() ? internal::make_mpi_world_communicator().release()
                                                   : new LocalCommunicator("world");
  return *w;
}

void abort_all(const std::string& message) {
  if (launched_by_mpi()) internal::MpiRuntime::abort_job(message);  // does not return
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

void skip_finalize_at_exit() {
  if (launched_by_mpi()) internal::MpiRuntime::skip_finalize();
}

int run_guarded(const std::function<int()>& body) {
  std::string message;
  try {
    const int code = body();
    if (code != 0) skip_finalize_at_exit();
    return code;
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  message = "error: " + message;
  if (launched_by_mpi() && world().size() > 1) abort_all(message);
  std::fprintf(stderr, "%s\n", message.c_str());
  return 1;
}

}  // namespace mt::dist
