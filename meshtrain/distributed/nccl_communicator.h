#pragma once
// The NCCL communicator: collectives whose buffers are GPU memory, one process per GPU
// (DESIGN §11). Each collective runs on the communicator's own CUDA stream, after the work
// already enqueued on the compute stream (an event), and its handle's wait() makes the compute
// stream follow it (another event) without blocking the host: gradient buckets reduce while
// the backward pass goes on. libnccl is loaded when first needed (dlopen), so a machine
// without it still runs meshtrain, staging device arrays through the host-memory MPI
// communicator instead; so do processes that share one GPU (NCCL refuses two ranks on one
// device).
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/distributed/communicator.h"

namespace mt::dist {

// A collective over `host` (every rank gets the same answer): an NCCL communicator over the
// same ranks, each on GPU `device_index` of its process, or nullptr with `why_not` saying why
// (the reasons of device_communicator_status()).
std::shared_ptr<Communicator> make_nccl_communicator(Communicator& host, int device_index, std::string* why_not);

// What make_nccl_communicator decides from what each rank says of its GPU, in rank order: an
// identity "host/GPU-uuid", or "!" and why it cannot take part. "" when NCCL can be used, else
// the reason, naming the ranks: a rank that cannot, or two ranks on one GPU.
std::string nccl_ineligibility(const std::vector<std::string>& rank_gpus);

}  // namespace mt::dist
