#include "meshtrain/distributed/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "meshtrain/core/dtype.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/mpi_runtime.h"

namespace mt::dist {

namespace {

static_assert(sizeof(bool) == 1, "bool buffers travel as MPI_UINT8_T");

// Non-reducing collectives move raw elements; 16-bit floats travel as their bits.
MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::boolean: return MPI_UINT8_T;
  }
  throw Error("[comm] invalid dtype");
}

// bool sum would overflow a byte; as a logical or it is a max over 0/1.
MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::boolean || op == ReduceOp::max) return MPI_MAX;
  return MPI_SUM;
}

constexpr int64_t kAllReduceChunkBytes = int64_t(4) << 20;

bool is_half(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

// Reusable staging for the all-reduce's bf16/f16 chunks and the reduce-scatter's rounds; only
// the communication thread touches it, so steady-state steps do not allocate.
char* staging_bytes(size_t n) {
  thread_local std::vector<char> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}
float* f32_scratch(size_t n) { return reinterpret_cast<float*>(staging_bytes(n * sizeof(float))); }

// `dtype` is bf16 or f16 (is_half): the bulk conversions of core/dtype.h.
void half_to_f32(const void* src, float* dst, int64_t n, DType dtype) {  // (n,) -> (n,)
  const auto* s = static_cast<const uint16_t*>(src);
  dtype == DType::bf16 ? bf16_to_f32_n(s, dst, n) : f16_to_f32_n(s, dst, n);
}

void f32_to_half(const float* src, void* dst, int64_t n, DType dtype) {  // (n,) -> (n,)
  auto* d = static_cast<uint16_t*>(dst);
  dtype == DType::bf16 ? f32_to_bf16_n(src, d, n) : f32_to_f16_n(src, d, n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string name)
      : Communicator(std::move(name)), comm_(comm), rank_(rank), size_(size) {}

  ~MpiCommunicator() override {
    internal::MpiRuntime& runtime = internal::MpiRuntime::instance();
    // Queued behind this communicator's pending collectives; after exit began, MPI_Finalize frees it.
    if (!runtime.stopping()) runtime.submit("free of communicator '" + name() + "'", [comm = comm_]() mutable {
      MPI_Comm_free(&comm);
    });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  CommHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    check_and_count(CollectiveKind::all_reduce, data, data, count, dtype);
    if (count == 0) return CommHandle::completed();
    std::string what = describe("all_reduce", reduce_op_name(op), count, dtype);
    return submit(what, [=, comm = comm_] {
      // Chunks of kAllReduceChunkBytes: measured ~2x faster than one call for 32-64 MiB buffers,
      // and bf16/f16 staging stays in cache. Every rank cuts the same chunks (same count, dtype).
      const bool half = is_half(dtype);
      const size_t elem = dtype_size(dtype);
      const int64_t chunk = kAllReduceChunkBytes / int64_t(half ? sizeof(float) : elem);
      for (int64_t offset = 0; offset < count; offset += chunk) {
        const int64_t n = std::min(chunk, count - offset);
        void* part = static_cast<char*>(data) + size_t(offset) * elem;
        if (half) {
          float* tmp = f32_scratch(size_t(n));
          half_to_f32(part, tmp, n, dtype);
          internal::check_mpi(MPI_Allreduce(MPI_IN_PLACE, tmp, int(n), MPI_FLOAT, mpi_op(op, DType::f32), comm), what);
          f32_to_half(tmp, part, n, dtype);
        } else {
          internal::check_mpi(MPI_Allreduce(MPI_IN_PLACE, part, int(n), mpi_type(dtype), mpi_op(op, dtype), comm),
                              what);
        }
      }
    }, count, dtype);
  }

  CommHandle all_gather_async(const void* send, void* recv, int64_t count, DType dtype) override {
    check_and_count(CollectiveKind::all_gather, send, recv, count, dtype);
    if (count == 0) return CommHandle::completed();
    const size_t block = size_t(count) * dtype_size(dtype);
    const bool in_place = send == static_cast<const char*>(recv) + size_t(rank_) * block;
    std::string what = describe("all_gather", nullptr, count, dtype);
    return submit(what, [=, comm = comm_] {
      const MPI_Datatype t = mpi_type(dtype);
      internal::check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : send, int(count), t, recv, int(count), t, comm),
                        what);
    }, count, dtype);
  }

  CommHandle reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    check_and_count(CollectiveKind::reduce_scatter, send, recv, count, dtype);
    if (count == 0) return CommHandle::completed();
    std::string what = describe("reduce_scatter", reduce_op_name(op), count, dtype);
    return submit(what, [=, comm = comm_, nranks = size_] {
      // In rounds over the blocks, like the all-reduce's chunks: each round stages every rank's
      // next piece side by side (kAllReduceChunkBytes in all) and reduce-scatters those.
      // OpenMPI reduces a whole call's input into a temporary of its full size (on two
      // ranks: a reduce to rank 0, then a scatter): in one call, FSDP's largest gradient (GPT-2
      // Large's 257 MB embedding) put rank 0's peak 0.28 GB above rank 1's, and the step of
      // spmd_step_bench --layouts fsdp took 286 ms against 233 ms in rounds.
      const bool half = is_half(dtype);
      const size_t elem = dtype_size(dtype), staged_elem = half ? sizeof(float) : elem;
      const int64_t piece = std::max<int64_t>(1, kAllReduceChunkBytes / int64_t(staged_elem) / nranks);
      const MPI_Datatype t = half ? MPI_FLOAT : mpi_type(dtype);
      const MPI_Op mop = mpi_op(op, half ? DType::f32 : dtype);
      const char* src = static_cast<const char*>(send);
      char* dst = static_cast<char*>(recv);
      if (!half && count <= piece) {  // one round: no staging
        internal::check_mpi(MPI_Reduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, int(count), t, mop, comm),
                            what);
        return;
      }
      // In place (send == recv), round k writes block 0's elements that rounds <= k staged.
      char* stage = staging_bytes(size_t(piece) * size_t(nranks + 1) * staged_elem);
      char* stage_out = stage + size_t(piece) * size_t(nranks) * staged_elem;
      for (int64_t offset = 0; offset < count; offset += piece) {
        const int64_t n = std::min(piece, count - offset);
        for (int r = 0; r < nranks; ++r) {
          const char* from = src + (size_t(r) * size_t(count) + size_t(offset)) * elem;
          char* to = stage + size_t(r) * size_t(n) * staged_elem;
          if (half) half_to_f32(from, reinterpret_cast<float*>(to), n, dtype);
          else std::memcpy(to, from, size_t(n) * elem);
        }
        char* out = half ? stage_out : dst + size_t(offset) * elem;
        internal::check_mpi(MPI_Reduce_scatter_block(stage, out, int(n), t, mop, comm), what);
        if (half) f32_to_half(reinterpret_cast<const float*>(stage_out), dst + size_t(offset) * elem, n, dtype);
      }
    }, count, dtype);
  }

  CommHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    check_and_count(CollectiveKind::all_to_all, send, recv, count, dtype);
    if (count == 0) return CommHandle::completed();
    std::string what = describe("all_to_all", nullptr, count, dtype);
    return submit(what, [=, comm = comm_] {
      const MPI_Datatype t = mpi_type(dtype);
      const void* src = send == recv ? MPI_IN_PLACE : send;
      internal::check_mpi(MPI_Alltoall(src, int(count), t, recv, int(count), t, comm), what);
    }, count, dtype);
  }

  CommHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    check_and_count(CollectiveKind::broadcast, data, data, count, dtype, root);
    if (count == 0) return CommHandle::completed();
    std::string what = describe("broadcast", nullptr, count, dtype) + " from root " + std::to_string(root);
    return submit(what, [=, comm = comm_] {
      internal::check_mpi(MPI_Bcast(data, int(count), mpi_type(dtype), root, comm), what);
    }, count, dtype);
  }

  void barrier() override {
    check_and_count(CollectiveKind::barrier, nullptr, nullptr, 0, DType::f32);
    std::string what = "barrier on '" + name() + "' (size " + std::to_string(size_) + ")";
    submit(what, [comm = comm_, what] { internal::check_mpi(MPI_Barrier(comm), what); }).wait();
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MT_CHECK(color >= 0, "[comm] split of '", this->name(), "' into '", name, "': negative color ", color);
    MPI_Comm out = MPI_COMM_NULL;
    int rank = 0, size = 0;
    const std::string what = "split of '" + this->name() + "' into '" + name + "'";
    internal::MpiRuntime::instance().run(what, [&, comm = comm_] {
      internal::check_mpi(MPI_Comm_split(comm, color, key, &out), what);
      MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
      MPI_Comm_rank(out, &rank);
      MPI_Comm_size(out, &size);
    });
    return std::make_shared<MpiCommunicator>(out, rank, size, name);
  }

 private:
  std::string describe(const char* op, const char* reduce, int64_t count, DType dtype) const {
    return ::mt::detail::concat(op, reduce ? "(" : "", reduce ? reduce : "", reduce ? ")" : "", " of ", count, " ",
                                dtype_name(dtype), " on '", name(), "' (size ", size_, ")");
  }

  // `what` names the collective on the communication thread (trace spans, the watchdog).
  // `count` elements of `dtype` in this rank's buffer: the profile's bytes for the collective.
  CommHandle submit(std::string what, std::function<void()> work, int64_t count = 0, DType dtype = DType::f32) {
    what += in_blocking_call() ? " [sync]" : " [async]";
    return CommHandle(internal::MpiRuntime::instance().submit(std::move(what), std::move(work),
                                                              double(count) * double(dtype_size(dtype))));
  }

  MPI_Comm comm_;
  int rank_;
  int size_;
};

}  // namespace

namespace internal {

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  MpiRuntime& runtime = MpiRuntime::instance();
  MPI_Comm comm = MPI_COMM_NULL;
  // A duplicate keeps meshtrain's collectives and error handler apart from any other MPI user.
  runtime.run("duplicate of MPI_COMM_WORLD", [&] {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup of MPI_COMM_WORLD");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  });
  return std::make_unique<MpiCommunicator>(comm, runtime.world_rank(), runtime.world_size(), "world");
}

}  // namespace internal

}  // namespace mt::dist
