#pragma once
// LocalCommunicator: the size-1 backend. Collectives are copies or no-ops that complete
// immediately; it never calls MPI, so programs run unchanged without mpirun.
#include "meshtrain/distributed/communicator.h"

namespace mt::dist {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name) : Communicator(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  CommHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override;
  CommHandle all_gather_async(const void* send, void* recv, int64_t count, DType dtype) override;
  CommHandle reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override;
  CommHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override;
  CommHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override;
  void barrier() override;
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override;
};

}  // namespace mt::dist
