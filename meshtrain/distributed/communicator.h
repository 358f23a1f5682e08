#pragma once
// Communicator: collectives over a group of ranks (MPI processes), with async variants.
// Backends: MPI (launched by mpirun; one communication thread owns MPI) and a size-1
// communicator that never touches MPI. SPMD programs issue the same collectives in the same
// order on every rank of a communicator; that is what makes them match.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "meshtrain/core/device.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/distributed/comm_handle.h"

namespace mt::dist {

// bool buffers: sum and max are both logical or.
enum class ReduceOp { sum, max };
const char* reduce_op_name(ReduceOp op);

enum class CollectiveKind { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, barrier };
const char* collective_name(CollectiveKind kind);

struct CollectiveCount {
  int64_t calls = 0;
  int64_t bytes = 0;  // this rank's input buffer: all_reduce/all_gather/broadcast count*elem,
                      // reduce_scatter/all_to_all size*count*elem, barrier 0
};

// Collectives issued on one communicator since construction or reset_stats().
struct CommStats {
  CollectiveCount all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, barrier;
  const CollectiveCount& operator[](CollectiveKind kind) const;
  CollectiveCount& operator[](CollectiveKind kind);
  int64_t total_calls() const;
  int64_t total_bytes() const;
  std::string str() const;  // "all_reduce: 2 calls, 8 KiB; barrier: 1 call" (kinds with calls only)
};

class Communicator {
 public:
  explicit Communicator(std::string name) : name_(std::move(name)) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // "world", a mesh axis name, ...: used in error messages and the hang watchdog.
  const std::string& name() const { return name_; }
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // All buffers are raw element buffers of `dtype` (f32, bf16, f16, i32, i64, bool), in this
  // process's memory. bf16/f16 reductions accumulate in f32 (convert, reduce, convert back).
  // A collective's buffers must stay valid until its handle is done.
  virtual CommHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) = 0;  // in place
  // recv: size*count, rank-major. send may be recv + rank*count (in place).
  virtual CommHandle all_gather_async(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // send: size*count rank-major blocks; recv: count (the reduction of block `rank`).
  // send == recv is in place: the result overwrites the first count elements.
  virtual CommHandle reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype,
                                          ReduceOp op) = 0;
  // send and recv: size*count; block j of send goes to rank j, block i of recv came from rank i.
  // send == recv is in place.
  virtual CommHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual CommHandle broadcast_async(void* data, int64_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;

  // Collective over this communicator: ranks passing the same color form a new communicator,
  // ordered by key (ties broken by rank in this communicator).
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Blocking conveniences: the async call followed by wait().
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op);
  void all_gather(const void* send, void* recv, int64_t count, DType dtype);
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op);
  void all_to_all(const void* send, void* recv, int64_t count, DType dtype);
  void broadcast(void* data, int64_t count, DType dtype, int root);

  // The communicator over the same ranks, in the same order, whose buffers are GPU memory on
  // `device` (NCCL, one process per GPU): collectives move device arrays without a trip
  // through the host. nullptr for CPU arrays, and where the ranks cannot have one;
  // device_communicator_status() says why (ranks sharing a GPU, a rank on the CPU, no NCCL
  // library on this machine, MT_NCCL=0, a build without CUDA). Callers then stage device
  // arrays through the host. The first call, whatever device it names, decides once for this
  // communicator, as a collective (it compares the GPU each rank uses, the array's or else
  // the process default's, and shares NCCL's id; its host collectives are not counted in
  // stats()): make it where every rank makes its other collectives, in the same order, even
  // a rank whose arrays are on the CPU. Later calls return the same answer without
  // communicating. (A device communicator is its own.)
  virtual Communicator* device_communicator(Device device);
  std::string device_communicator_status() const;

  // Counters of issued collectives (calls and bytes) by kind, so tests can assert e.g.
  // "exactly one all_reduce on the model axis" for a tensor-parallel MLP.
  CommStats stats() const;
  void reset_stats();

 protected:
  // True while a blocking convenience (all_reduce, ...) issues its collective: traces tag
  // collectives "sync" or "async".
  static bool in_blocking_call();
  // While one lives on this thread, check_and_count checks but does not count (the
  // collectives that set up a device communicator are not the program's).
  struct Uncounted {
    Uncounted();
    ~Uncounted();
    bool previous_;
  };
  // Validates the arguments of a collective (throws mt::Error "[comm] ...") and counts it.
  // Every backend calls it first in every collective, so checks and stats are uniform.
  void check_and_count(CollectiveKind kind, const void* send, const void* recv, int64_t count,
                       DType dtype, int root = 0);

 private:
  struct BlockingCall {  // marks this thread as inside a blocking convenience
    BlockingCall();
    ~BlockingCall();
    bool previous_;
  };
  std::string name_;
  mutable std::mutex device_mu_;
  bool device_decided_ = false;
  std::shared_ptr<Communicator> device_comm_;
  std::string device_status_;
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

// The process-wide communicator over all ranks: MPI when launched by mpirun (detected from
// OMPI_COMM_WORLD_SIZE / PMIX_RANK / PMI_SIZE), otherwise a size-1 communicator that never
// calls MPI (MPI_Init is not even called). Created on first use; lives until exit, when
// pending collectives are drained and MPI is finalized. Under mpirun a collective that has not
// completed after MT_COMM_TIMEOUT_S seconds (default 1800; 0 disables) ends the job with a
// message naming it, so mismatched collectives fail instead of hanging.
Communicator& world();
bool launched_by_mpi();

// Prints `message` (prefixed with the rank) to stderr and ends every rank of the job:
// MPI_Abort under mpirun, exit code 1 otherwise. Never returns. An application's main must
// call it for an uncaught error when world().size() > 1: a rank that just returned would
// leave the others waiting in their next collective (or in MPI_Finalize) forever.
[[noreturn]] void abort_all(const std::string& message);

// Runs `body` (an application's main) and returns its exit code. An escaping exception is
// reported and, with more than one rank, ends the whole job through abort_all; a non-zero exit
// code under mpirun calls skip_finalize_at_exit, so a rank failing alone ends the job too.
int run_guarded(const std::function<int()>& body);

// MPI_Finalize (run at exit) waits for every rank, so a rank that exits early with an error
// would wait for peers that wait for it. After this call the exit handler skips it; mpirun
// then sees the rank end without finalizing and stops the job. No-op without mpirun.
void skip_finalize_at_exit();

}  // namespace mt::dist
