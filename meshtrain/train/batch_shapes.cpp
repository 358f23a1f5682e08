#include "meshtrain/train/batch_shapes.h"

#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::train {
namespace {

// FNV-1a over the fields' names, dtypes and dims, in the batch's order.
int64_t signature(const Batch& b) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  for (const auto& [name, a] : b) {
    for (char c : name) mix(uint64_t(uint8_t(c)));
    mix(uint64_t(a.dtype()));
    mix(uint64_t(a.ndim()));
    for (int64_t d : a.shape()) mix(uint64_t(d));
  }
  return int64_t(h);
}

std::string shape_text(const Array& a) {
  std::string s = "(";
  for (int64_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.dim(i));
  return s + (a.ndim() == 1 ? ",)" : ")") + " " + dtype_name(a.dtype());
}

}  // namespace

Batch pad_to_ranks_longest(const Batch& local, const std::vector<PaddedFields>& groups, dist::Communicator& comm) {
  // A length per group, and last whether this rank's batch is unfit: every rank learns it from
  // the one all-reduce, so none is left waiting in a collective the failing rank never joins.
  std::vector<int64_t> longest(groups.size() + 1, 0);
  std::string problem;
  for (size_t g = 0; g < groups.size() && problem.empty(); ++g) {
    std::string first;
    for (const auto& [name, value] : groups[g]) {
      if (!local.contains(name)) continue;
      const Array& a = local[name];
      if (a.ndim() < 2) {
        problem = detail::concat("batch field '", name, "' is ", shape_text(a),
                                 "; a field padded to the longest row needs a second (length) dimension");
        break;
      }
      if (!first.empty() && a.dim(1) != longest[g]) {
        problem = detail::concat("batch fields '", first, "' and '", name,
                                 "' are padded to one longest row but have lengths ", longest[g], " and ", a.dim(1));
        break;
      }
      if (first.empty()) first = name;
      longest[g] = a.dim(1);
    }
  }
  longest.back() = problem.empty() ? 0 : 1;
  // Every rank joins the all-reduce, also one whose batch holds none of the fields: ranks
  // that skipped it would wait for each other in the step's collectives.
  if (comm.size() > 1) comm.all_reduce(longest.data(), int64_t(longest.size()), DType::i64, dist::ReduceOp::max);
  if (!problem.empty()) throw Error("[trainer] " + problem);
  if (longest.back() != 0)
    throw Error(detail::concat("[trainer] rank ", comm.rank(), " stops: another rank's batch cannot be padded to the "
                               "ranks' longest row (that rank names its fields)"));
  Batch out;
  for (const auto& [name, a] : local) {
    Array padded = a;
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto pad = groups[g].find(name);
      if (pad == groups[g].end() || padded.dim(1) >= longest[g]) continue;
      Shape extra = padded.shape();
      extra[1] = longest[g] - padded.dim(1);
      padded = concatenate({padded, Array::full(extra, pad->second, a.dtype(), a.device())}, 1);
    }
    out.set(name, padded);
  }
  return out;
}

void check_same_batch_shapes(const Batch& local, dist::Communicator& comm) {
  if (comm.size() == 1) return;
  const int64_t mine = signature(local);
  std::vector<int64_t> all(size_t(comm.size()));
  comm.all_gather(&mine, all.data(), 1, DType::i64);
  int other = -1;
  for (int r = 0; r < comm.size() && other < 0; ++r)
    if (all[size_t(r)] != mine) other = r;
  if (other < 0) return;
  // Every rank sees the mismatch and throws, so none waits in the step's collectives. The
  // other rank's shapes are not fetched: this rank's are named, and the other rank's error
  // names its own.
  std::string fields;
  for (const auto& [name, a] : local) fields += (fields.empty() ? "" : ", ") + name + " " + shape_text(a);
  throw Error(detail::concat("[trainer] the batch differs between ranks: rank ", comm.rank(), " collated {", fields,
                             "} but rank ", other, "'s fields, dtypes or shapes differ. Every rank's collate must give "
                             "the same shapes: pad to a fixed length, or name the fields padded to their slice's longest row "
                             "(Trainer::set_padded_fields; padded_fields= in Python) so that the ranks pad them alike"));
}

}  // namespace mt::train
