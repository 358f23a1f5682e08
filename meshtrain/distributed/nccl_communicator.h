#pragma once
// The NCCL communicator: collectives whose buffers are GPU memory, one process per GPU
// (DESIGN §11). Each collective runs on the NCCL stream (one per process, shared by all NCCL
// communicators, so their collectives keep the order they were issued in on every rank),
// after the work already enqueued on the compute stream (an event), and its handle's wait()
// makes the compute stream follow it (another event) without blocking the host: gradient
// buckets reduce while the backward pass goes on. bf16/f16 reductions go through f32 copies,
// rounded once, as on the host. libnccl is loaded when first needed (dlopen), so a machine
// without it still runs meshtrain, staging device arrays through the host-memory MPI
// communicator instead; so do processes that share one GPU (NCCL refuses two ranks on one
// device).
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/distributed/communicator.h"

namespace mt::dist {

// A collective over `host` (every rank gets the same answer): an NCCL communicator over the
// same ranks, each on the GPU `device` names in its process, or nullptr with `why_not` saying
// why (the reasons of device_communicator_status()). A rank whose arrays are on the CPU takes
// part too (it says so), so ranks on mixed devices stay in step. Without CUDA in the build it
// returns nullptr on every rank without communicating.
std::shared_ptr<Communicator> make_nccl_communicator(Communicator& host, Device device, std::string* why_not);

// What make_nccl_communicator decides from what each rank says of its GPU, in rank order: an
// identity "host/GPU-uuid", or "!" and why it cannot take part. "" when NCCL can be used, else
// the reason, naming the ranks: a rank that cannot, or two ranks on one GPU.
std::string nccl_ineligibility(const std::vector<std::string>& rank_gpus);

}  // namespace mt::dist
