#include "meshtrain/ops/deferred_checks.h"

#include <map>
#include <utility>

#include "meshtrain/backend/indexing.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt {

namespace {

thread_local DeferredChecks* t_current = nullptr;

// So many recorded checks without a read is a loop of steps that never read: read early
// rather than hold every batch's indices alive.
constexpr size_t kMaxPending = 4096;

// The value at flat `position` of an i32/i64 index array, read to the host.
int64_t value_at(const Array& indices, int64_t position) {
  const Array host = indices.device().is_cpu() ? indices : Array(indices).to(Device::cpu());
  return indices.dtype() == DType::i32 ? int64_t(host.data<int32_t>()[position]) : host.data<int64_t>()[position];
}

[[noreturn]] void fail(const PendingCheck& check, int64_t position, const std::string& note) {
  const int64_t n = check.indices.numel();
  auto misfire = [&](const std::string& what) {
    return VerdictMisfire(detail::concat("[deferred checks] a verdict names flat position ", position, " of indices ",
                                         check.indices.str(), what,
                                         ": its word on the device was overwritten, an internal error of meshtrain, "
                                         "not of the data (with CUDA graphs, --cuda-graphs off avoids it; please "
                                         "report it)"));
  };
  if (position < 0 || position >= n) throw misfire(detail::concat(", which has ", n, " entries"));
  const int64_t value = value_at(check.indices, position);
  if (check.size >= 0 && ((value >= 0 && value < check.size) || value == check.skip))
    throw misfire(detail::concat(", whose index ", value, " is in range [0, ", check.size, ")"));
  throw Error(check.message(position, value) + note);
}

// The words of i64 scalars on one device: read in place on the CPU (no wait, not counted), in
// one copy (one counted read) elsewhere.
std::vector<int64_t> read_words(const std::vector<Array>& words) {
  std::vector<int64_t> out;
  out.reserve(words.size());
  if (words.front().device().is_cpu()) {
    for (const Array& w : words) out.push_back(w.data<int64_t>()[0]);
    return out;
  }
  return (words.size() == 1 ? words.front() : stack(words, 0)).to_ints();
}

}  // namespace

DeferredChecks::DeferredChecks() : outer_(t_current) { t_current = this; }

DeferredChecks::~DeferredChecks() { t_current = outer_; }

DeferredChecks* DeferredChecks::current() { return t_current; }

void DeferredChecks::record(PendingCheck check) {
  checks_.push_back(std::move(check));
  if (checks_.size() >= kMaxPending) read();
}

std::vector<PendingCheck> DeferredChecks::take() {
  std::vector<PendingCheck> checks = std::move(checks_);
  checks_.clear();
  return checks;
}

void DeferredChecks::read() { read_checks(take()); }

void read_checks(std::vector<PendingCheck> checks) {
  if (checks.empty()) return;
  // Grouped by device, each group in one read; the first failure in recording order wins.
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < checks.size(); ++i) by_device[checks[i].first.device().str()].push_back(i);
  std::vector<int64_t> first(checks.size(), kNoBadIndex);
  for (const auto& [device, members] : by_device) {
    std::vector<Array> words;
    for (size_t i : members) words.push_back(checks[i].first);
    const std::vector<int64_t> values = read_words(words);
    for (size_t k = 0; k < members.size(); ++k) first[members[k]] = values[k];
  }
  for (size_t i = 0; i < checks.size(); ++i)
    if (first[i] != kNoBadIndex)
      fail(checks[i], first[i], " (found when the step's results were read: the check was deferred)");
}

void settle_now(const PendingCheck& check) {
  const int64_t position = read_words({check.first}).front();
  if (position != kNoBadIndex) fail(check, position, "");
}

}  // namespace mt
