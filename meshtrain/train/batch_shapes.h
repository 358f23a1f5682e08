#pragma once
// Every rank's slice of a training batch must have the same fields, dtypes and shapes: the
// step's collectives (the gradient of a position table sliced to the batch's length, a loss
// mean over the data axis) are sized by them, so ranks whose collate padded to different
// lengths would issue mismatched collectives, fail deep inside MPI, or silently disagree.
// The Trainer checks each batch before its step with one 8-byte all-gather on the host (no
// array data is read) and reports a mismatch on every rank, naming the field and the shapes.
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/train/deployer.h"

namespace mt::train {

// Collective over `comm`: returns when all ranks' `local` batches agree; otherwise throws
// mt::Error on every rank ("[trainer] batch field 'labels' is (1, 6) on rank 0 but (1, 4) on
// rank 1 ...").
void check_same_batch_shapes(const Batch& local, dist::Communicator& comm);

}  // namespace mt::train
