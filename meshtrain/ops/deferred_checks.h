#pragma once
// Checks whose verdicts stay on the device until the step's loss is read (issue 45). An index
// check on a GPU is a device scan: reading its verdict at once makes the host wait for the
// stream mid-step, which idles the GPU while the host enqueues what follows and makes the step
// uncapturable as one CUDA graph. Inside a DeferredChecks scope the checks record their
// verdicts instead; read() fetches them all at once (one wait, after the loss's) and throws the
// first failure's message, naming the op, the position and the value as an immediate check
// would. Meanwhile the kernels read in bounds (ops/index_checks.h zeroes the bad entries), so a
// bad index costs a wasted step, never a fault.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/core/error.h"

namespace mt {

// The message of a failed check from its bad flat position and the value found there.
using CheckMessage = std::function<std::string(int64_t position, int64_t value)>;

// A recorded check: `first` (an i64 scalar, kNoBadIndex when all is well) over `indices`,
// whose entries are good in [0, size) or equal to skip (size < 0: the range is not known).
struct PendingCheck {
  Array first;
  Array indices;
  CheckMessage message;
  int64_t size = -1, skip = 0;
};

// A verdict that cannot be true: it names a position outside the indices, or one whose index is
// in range. The verdict word was overwritten on the device: meshtrain's fault, not the data's.
class VerdictMisfire : public Error {
 public:
  using Error::Error;
};

// Open on the thread that runs the step; scopes nest and the innermost collects.
class DeferredChecks {
 public:
  DeferredChecks();
  ~DeferredChecks();
  DeferredChecks(const DeferredChecks&) = delete;
  DeferredChecks& operator=(const DeferredChecks&) = delete;

  // The innermost open scope on this thread, or nullptr.
  static DeferredChecks* current();

  void record(PendingCheck check);
  size_t pending() const { return checks_.size(); }
  // Reads every verdict recorded so far (one read per device) and forgets them; throws
  // mt::Error with the first failed check's message.
  void read();
  // The verdicts recorded so far, unread, moved out (a step whose results are read later
  // keeps them with its loss; read them with read_checks).
  std::vector<PendingCheck> take();

 private:
  std::vector<PendingCheck> checks_;
  DeferredChecks* outer_;
};

// Reads the verdicts of `checks` (one read per device) and throws the first failure's message,
// as DeferredChecks::read does.
void read_checks(std::vector<PendingCheck> checks);

// Throws the check's message when `first` names a bad position; reads `first` now (on a GPU a
// wait for the stream, counted by host_read_count; on the CPU free and not counted).
void settle_now(const PendingCheck& check);

}  // namespace mt
