#pragma once
// Every rank's slice of a training batch must have the same fields, dtypes and shapes: the
// step's collectives (the gradient of a position table sliced to the batch's length, a loss
// mean over the data axis) are sized by them, so ranks whose collate padded to different
// lengths would issue mismatched collectives, fail deep inside MPI, or silently disagree.
// The Trainer checks each batch before its step with one 8-byte all-gather on the host (no
// array data is read) and reports a mismatch on every rank, naming the field and the shapes.
#include <map>
#include <string>
#include <vector>

#include "meshtrain/distributed/communicator.h"
#include "meshtrain/train/deployer.h"

namespace mt::train {

// Fields that a collate pads only to its own slice's longest row (dynamic padding, as HF's
// DataCollatorWithPadding does), each with the value that pads it (a pad token id, 0 for a
// mask, -100 for labels): one group of fields that share a length (a seq2seq batch has two,
// its sources' and its targets'). Every rank collates its own slice of the global batch, so
// two ranks' slices may come out of different lengths; before a step they are padded along
// axis 1 to the longest.
using PaddedFields = std::map<std::string, double>;

// Collective over `comm` (one all-reduce of a length per group): `local` with the fields of
// each group it holds padded along axis 1 to the group's longest length on any rank. The
// columns are appended on the right: rows must be right-padded (padding after the real
// tokens, masked out or without a target), so that the step's results are those of the
// ranks' own lengths; left-padded rows (as generation batches are) must not be named. Throws
// mt::Error on every rank when one rank's batch has a named field that is not at least
// two-dimensional, or two fields of one group of different lengths (that rank names them).
Batch pad_to_ranks_longest(const Batch& local, const std::vector<PaddedFields>& groups, dist::Communicator& comm);

// Collective over `comm`: returns when all ranks' `local` batches agree; otherwise throws
// mt::Error on every rank ("[trainer] batch field 'labels' is (1, 6) on rank 0 but (1, 4) on
// rank 1 ...").
void check_same_batch_shapes(const Batch& local, dist::Communicator& comm);

}  // namespace mt::train
