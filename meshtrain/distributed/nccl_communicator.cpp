#include "meshtrain/distributed/nccl_communicator.h"

#include <map>

#include "meshtrain/core/error.h"

#if MT_WITH_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>

#include "meshtrain/backend/cuda/cuda_common.h"
#include "meshtrain/backend/elementwise.h"
#endif

namespace mt::dist {

std::string nccl_ineligibility(const std::vector<std::string>& rank_gpus) {
  std::map<std::string, size_t> first_rank_on;
  for (size_t r = 0; r < rank_gpus.size(); ++r) {
    const std::string& gpu = rank_gpus[r];
    if (gpu.empty() || gpu[0] == '!')
      return "rank " + std::to_string(r) + ": " + (gpu.empty() ? std::string("no GPU identity") : gpu.substr(1));
    auto [it, fresh] = first_rank_on.emplace(gpu, r);
    if (!fresh)
      return "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " share GPU " + gpu +
             " (NCCL takes one process per GPU; their collectives go through host memory)";
  }
  return "";
}

#if MT_WITH_CUDA

namespace {

// The NCCL entry points meshtrain calls, looked up in libnccl.so.2 at run time.
struct NcclLibrary {
  std::string error;  // why it is not usable ("" when it is)
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommSplit) split = nullptr;  // NCCL >= 2.18; split() says so when missing
  decltype(&ncclCommCount) count = nullptr;
  decltype(&ncclCommUserRank) user_rank = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

template <class F>
bool bind(void* lib, const char* symbol, F& slot, std::string& error) {
  slot = reinterpret_cast<F>(dlsym(lib, symbol));
  if (!slot && error.empty()) error = std::string("libnccl has no ") + symbol;
  return slot != nullptr;
}

const NcclLibrary& nccl() {
  static const NcclLibrary lib = [] {
    NcclLibrary l;
    const char* named = std::getenv("MT_NCCL_LIBRARY");
    void* h = dlopen(named && *named ? named : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      l.error = std::string("cannot load ") + (named && *named ? named : "libnccl.so.2") + ": " + dlerror();
      return l;
    }
    bind(h, "ncclGetUniqueId", l.get_unique_id, l.error);
    bind(h, "ncclCommInitRank", l.init_rank, l.error);
    bind(h, "ncclCommDestroy", l.destroy, l.error);
    bind(h, "ncclCommCount", l.count, l.error);
    bind(h, "ncclCommUserRank", l.user_rank, l.error);
    bind(h, "ncclCommGetAsyncError", l.async_error, l.error);
    bind(h, "ncclGetErrorString", l.error_string, l.error);
    bind(h, "ncclAllReduce", l.all_reduce, l.error);
    bind(h, "ncclAllGather", l.all_gather, l.error);
    bind(h, "ncclReduceScatter", l.reduce_scatter, l.error);
    bind(h, "ncclBroadcast", l.broadcast, l.error);
    bind(h, "ncclSend", l.send, l.error);
    bind(h, "ncclRecv", l.recv, l.error);
    bind(h, "ncclGroupStart", l.group_start, l.error);
    bind(h, "ncclGroupEnd", l.group_end, l.error);
    std::string optional;
    bind(h, "ncclCommSplit", l.split, optional);
    return l;
  }();
  return lib;
}

void check_nccl(ncclResult_t r, const char* what, const std::string& comm) {
  if (r == ncclSuccess) return;
  throw Error("[nccl] " + std::string(what) + " on '" + comm + "': " + nccl().error_string(r));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::boolean: return ncclUint8;  // 0/1 bytes: or = max
  }
  throw Error("[nccl] unsupported dtype");
}

ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  if (dtype == DType::boolean) return ncclMax;  // sum of bools is logical or, as on the host
  return op == ReduceOp::sum ? ncclSum : ncclMax;
}

// Fixed-size records for the host collectives that set NCCL up (i32 elements: every
// backend moves them unchanged).
constexpr int kRecordInts = 32;
using Record = std::array<int32_t, kRecordInts>;
Record to_record(const std::string& text) {
  Record r{};
  std::memcpy(r.data(), text.data(), std::min(text.size(), sizeof(Record) - 1));
  return r;
}
std::string from_record(const int32_t* r) {
  const char* c = reinterpret_cast<const char*>(r);
  return std::string(c, strnlen(c, sizeof(Record) - 1));
}

// All NCCL communicators of the process share one stream: their collectives run in the order
// they were issued, the same order on every rank, so two communicators (a data and a model
// axis) cannot wait on each other's kernels across ranks. Leaked: collectives may be queued
// until exit.
cudaStream_t comm_stream(int device) {
  static std::mutex* mu = new std::mutex;  // leaked: used by communicators destroyed at exit
  static cudaStream_t stream = nullptr;
  std::lock_guard<std::mutex> lock(*mu);
  if (!stream) {
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate (NCCL)");
  }
  return stream;
}

// "host/GPU-<uuid>" of this process's GPU, or "!" and why it cannot take part.
std::string this_rank_gpu(Device device) {
  if (!device.is_cuda()) return "!arrays on " + device.str();
  const char* env = std::getenv("MT_NCCL");
  if (env && std::string(env) == "0") return "!MT_NCCL=0";
  if (!nccl().error.empty()) return "!" + nccl().error;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device.index) != cudaSuccess) {
    cudaGetLastError();
    return "!no CUDA device " + std::to_string(device.index);
  }
  try {
    comm_stream(device.index);
  } catch (const std::exception& e) {
    return std::string("!") + e.what();
  }
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::string id = std::string(host) + "/GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    const unsigned char b = static_cast<unsigned char>(p.uuid.bytes[i]);
    id += hex[b >> 4];
    id += hex[b & 15];
  }
  return id;
}

struct EventDeleter {
  void operator()(CUevent_st* e) const {
    if (e) cudaEventDestroy(e);
  }
};
using Event = std::shared_ptr<CUevent_st>;
Event make_event() {
  cudaEvent_t e = nullptr;
  cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return Event(e, EventDeleter{});
}

// The NCCL communicator handle, shared with the handles of its pending collectives (a
// handle's join may run after the Communicator object is gone).
struct NcclComm {
  ncclComm_t comm = nullptr;
  int device = 0;
  ~NcclComm() {
    // After CUDA has shut down (a communicator destroyed at exit) NCCL's resources go with the
    // process; waiting or destroying then could hang.
    try {
      if (cudaSetDevice(device) != cudaSuccess || cudaStreamSynchronize(comm_stream(device)) != cudaSuccess) {
        cudaGetLastError();
        return;
      }
    } catch (...) {
      return;
    }
    nccl().destroy(comm);
  }
};

// A caller's device buffer as an array (not owned), for the cast kernels.
Array device_view(const void* p, int64_t n, DType dtype, int device) {
  auto impl = std::make_shared<ArrayImpl>();
  impl->shape = Shape({n});
  impl->dtype = dtype;
  impl->storage = std::shared_ptr<void>(std::shared_ptr<void>(), const_cast<void*>(p));
  impl->device = Device::cuda(device);
  return Array(std::move(impl));
}

bool narrow_float(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::string name, ncclComm_t comm, int rank, int size, int device)
      : Communicator(std::move(name)), comm_(std::make_shared<NcclComm>()), rank_(rank), size_(size), device_(device) {
    comm_->comm = comm;
    comm_->device = device;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Communicator* device_communicator(Device) override { return this; }

  CommHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    check_and_count(CollectiveKind::all_reduce, data, data, count, dtype);
    if (count == 0) return CommHandle::completed();
    if (narrow_float(dtype)) {  // the contract: bf16/f16 accumulate in f32, rounded once
      Array narrow = device_view(data, count, dtype, device_), wide = widened(narrow);
      return enqueue(
          "ncclAllReduce",
          [&](cudaStream_t s) {
            check_nccl(nccl().all_reduce(wide.raw(), wide.raw(), size_t(count), ncclFloat32, nccl_op(op, dtype),
                                         comm_->comm, s),
                       "ncclAllReduce", name());
          },
          [narrow, wide]() mutable { cuda::cast(wide, narrow); });
    }
    return enqueue("ncclAllReduce", [&](cudaStream_t s) {
      check_nccl(nccl().all_reduce(data, data, size_t(count), nccl_type(dtype), nccl_op(op, dtype), comm_->comm, s),
                 "ncclAllReduce", name());
    });
  }

  CommHandle all_gather_async(const void* send, void* recv, int64_t count, DType dtype) override {
    check_and_count(CollectiveKind::all_gather, send, recv, count, dtype);
    if (count == 0) return CommHandle::completed();
    // In place (send == recv + rank*count) is NCCL's in-place all-gather too.
    return enqueue("ncclAllGather", [&](cudaStream_t s) {
      check_nccl(nccl().all_gather(send, recv, size_t(count), nccl_type(dtype), comm_->comm, s), "ncclAllGather",
                 name());
    });
  }

  CommHandle reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    check_and_count(CollectiveKind::reduce_scatter, send, recv, count, dtype);
    if (count == 0) return CommHandle::completed();
    // The result goes to a separate buffer and is copied (or cast) into recv at wait():
    // NCCL's in-place form would put it at recv + rank*count, ours is at recv.
    const bool narrow = narrow_float(dtype);
    const Array input = narrow ? widened(device_view(send, count * size_, dtype, device_))
                               : device_view(send, count * size_, dtype, device_);
    Array out = Array::empty({count}, input.dtype(), Device::cuda(device_));
    Array target = device_view(recv, count, dtype, device_);
    return enqueue(
        "ncclReduceScatter",
        [&](cudaStream_t s) {
          check_nccl(nccl().reduce_scatter(input.raw(), out.raw(), size_t(count), nccl_type(input.dtype()),
                                           nccl_op(op, dtype), comm_->comm, s),
                     "ncclReduceScatter", name());
        },
        [input, out, target]() mutable {
          if (out.dtype() != target.dtype()) {
            cuda::cast(out, target);
          } else {
            cuda_runtime().copy_on_device(target.raw(), out.raw(), out.nbytes());
          }
        });
  }

  CommHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    check_and_count(CollectiveKind::all_to_all, send, recv, count, dtype);
    if (count == 0) return CommHandle::completed();
    const size_t block = size_t(count) * dtype_size(dtype);
    // In place: every block is read (copied on the compute stream) before any is overwritten.
    Array from = device_view(send, count * size_, dtype, device_);
    if (send == recv) {
      Array copy = Array::empty({count * size_}, dtype, Device::cuda(device_));
      cuda_runtime().copy_on_device(copy.raw(), send, block * size_t(size_));
      from = copy;
    }
    return enqueue(
        "all_to_all",
        [&](cudaStream_t s) {
          const char* src = static_cast<const char*>(from.raw());
          char* to = static_cast<char*>(recv);
          check_nccl(nccl().group_start(), "ncclGroupStart", name());
          try {
            for (int peer = 0; peer < size_; ++peer) {
              check_nccl(nccl().send(src + size_t(peer) * block, size_t(count), nccl_type(dtype), peer, comm_->comm, s),
                         "ncclSend", name());
              check_nccl(nccl().recv(to + size_t(peer) * block, size_t(count), nccl_type(dtype), peer, comm_->comm, s),
                         "ncclRecv", name());
            }
          } catch (...) {
            nccl().group_end();  // never leave the group open
            throw;
          }
          check_nccl(nccl().group_end(), "ncclGroupEnd", name());
        },
        [from]() {});
  }

  CommHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    check_and_count(CollectiveKind::broadcast, data, data, count, dtype, root);
    if (count == 0) return CommHandle::completed();
    return enqueue("ncclBroadcast", [&](cudaStream_t s) {
      check_nccl(nccl().broadcast(data, data, size_t(count), nccl_type(dtype), root, comm_->comm, s),
                 "ncclBroadcast", name());
    });
  }

  void barrier() override {
    check_and_count(CollectiveKind::barrier, nullptr, nullptr, 0, DType::i32);
    Array token = Array::zeros({1}, DType::i32, Device::cuda(device_));
    enqueue("barrier", [&](cudaStream_t s) {
      check_nccl(nccl().all_reduce(token.raw(), token.raw(), 1, ncclInt32, ncclSum, comm_->comm, s), "barrier",
                 name());
    }).wait();
    cuda::check(cudaStreamSynchronize(comm_stream(device_)), "barrier");
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MT_CHECK(nccl().split, "[nccl] split of '", this->name(), "' needs ncclCommSplit (NCCL >= 2.18); this libnccl has none");
    ncclComm_t sub = nullptr;
    check_nccl(nccl().split(comm_->comm, color, key, &sub, nullptr), "ncclCommSplit", this->name());
    int rank = 0, size = 0;
    check_nccl(nccl().user_rank(sub, &rank), "ncclCommUserRank", name);
    check_nccl(nccl().count(sub, &size), "ncclCommCount", name);
    return std::make_shared<NcclCommunicator>(name, sub, rank, size, device_);
  }

 private:
  // An f32 copy of a bf16/f16 device buffer, cast on the compute stream.
  Array widened(const Array& narrow) const {
    Array wide = Array::empty(narrow.shape(), DType::f32, Device::cuda(device_));
    cuda::cast(narrow, wide);
    return wide;
  }

  // Runs `issue` on the NCCL stream after the compute stream's work so far. The handle's join
  // makes the compute stream wait for it, then enqueues `finish` there (a cast or copy into
  // the caller's buffer) and drops what `finish` holds: buffers the caching allocator then
  // frees on the compute stream, after the collective.
  template <class Issue>
  CommHandle enqueue(const char* what, Issue&& issue, std::function<void()> finish = nullptr) {
    cuda::check(cudaSetDevice(device_), "cudaSetDevice");
    const cudaStream_t ns = comm_stream(device_);
    const Event ready = make_event(), done = make_event();
    cuda::check(cudaEventRecord(ready.get(), cuda::stream()), what);
    cuda::check(cudaStreamWaitEvent(ns, ready.get(), 0), what);
    try {
      issue(ns);
    } catch (...) {
      // What was enqueued before the failure still runs: order the compute stream (and so
      // the frees of the buffers it uses) after it.
      if (cudaEventRecord(done.get(), ns) == cudaSuccess) cudaStreamWaitEvent(cuda::stream(), done.get(), 0);
      cudaGetLastError();
      throw;
    }
    cuda::check(cudaEventRecord(done.get(), ns), what);
    std::string label = "[nccl] " + std::string(what) + " on '" + name() + "'";
    return CommHandle::stream_ordered(
        [done, comm = comm_, finish, label, device = device_]() mutable -> std::string {
          cudaSetDevice(device);
          if (cudaStreamWaitEvent(cuda::stream(), done.get(), 0) != cudaSuccess)
            return label + ": " + cudaGetErrorString(cudaGetLastError());
          ncclResult_t async = ncclSuccess;
          if (nccl().async_error(comm->comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
            return label + ": " + nccl().error_string(async);
          if (finish) {
            finish();
            finish = nullptr;
          }
          return "";
        },
        [done] {
          const cudaError_t e = cudaEventQuery(done.get());
          if (e == cudaErrorNotReady) {
            cudaGetLastError();  // not an error: must not reach the next kernel's launch check
            return false;
          }
          return true;  // finished, or failed: wait() reports it
        });
  }

  std::shared_ptr<NcclComm> comm_;
  int rank_, size_, device_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(Communicator& host, Device device, std::string* why_not) {
  const int size = host.size(), rank = host.rank();
  const int device_index = device.index;
  // 1. Every rank says which GPU it has (or why it cannot take part); all decide alike.
  const Record mine = to_record(this_rank_gpu(device));
  std::vector<int32_t> all(size_t(size) * kRecordInts);
  host.all_gather(mine.data(), all.data(), kRecordInts, DType::i32);
  std::vector<std::string> gpus;
  for (int r = 0; r < size; ++r) gpus.push_back(from_record(all.data() + size_t(r) * kRecordInts));
  std::string why = nccl_ineligibility(gpus);
  // 2. Rank 0 makes NCCL's id and shares it (or the error that stopped it).
  std::array<int32_t, 1 + sizeof(ncclUniqueId) / 4> id_message{};
  ncclUniqueId id{};
  if (why.empty()) {
    if (rank == 0) {
      const ncclResult_t r = nccl().get_unique_id(&id);
      id_message[0] = int32_t(r);
      std::memcpy(id_message.data() + 1, &id, sizeof id);
    }
    host.broadcast(id_message.data(), int64_t(id_message.size()), DType::i32, 0);
    if (id_message[0] != ncclSuccess)
      why = std::string("ncclGetUniqueId failed on rank 0: ") + nccl().error_string(ncclResult_t(id_message[0]));
    std::memcpy(&id, id_message.data() + 1, sizeof id);
  }
  if (!why.empty()) {
    if (why_not) *why_not = why;
    return nullptr;
  }
  // 3. Every rank joins; they agree that all did before anyone uses it.
  cuda::check(cudaSetDevice(device_index), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  const ncclResult_t r = nccl().init_rank(&comm, size, id, rank);
  int32_t failed = r == ncclSuccess ? 0 : 1;
  host.all_reduce(&failed, 1, DType::i32, ReduceOp::max);
  if (failed) {
    if (r == ncclSuccess) nccl().destroy(comm);
    if (why_not)
      *why_not = r == ncclSuccess ? std::string("ncclCommInitRank failed on another rank")
                                  : std::string("ncclCommInitRank: ") + nccl().error_string(r);
    return nullptr;
  }
  return std::make_shared<NcclCommunicator>(host.name(), comm, rank, size, device_index);
}

#else  // without CUDA in the build

std::shared_ptr<Communicator> make_nccl_communicator(Communicator&, Device, std::string* why_not) {
  if (why_not) *why_not = "meshtrain was built without CUDA";
  return nullptr;
}

#endif

}  // namespace mt::dist
