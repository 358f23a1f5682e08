#include "meshtrain/layout/rules.h"

#include <algorithm>
#include <set>

#include "meshtrain/core/error.h"

namespace mt::layout {

namespace rules {

namespace {

int64_t numel(const ArgInfo& a) { return a.defined ? a.shape.numel() : 0; }

// The defined input with the most elements: its layout wins conflicts.
size_t largest(const std::vector<ArgInfo>& in) {
  size_t best = 0;
  for (size_t i = 0; i < in.size(); ++i)
    if (numel(in[i]) > numel(in[best])) best = i;
  return best;
}

std::vector<std::string> common_partial(const std::vector<ArgInfo>& in) {
  std::vector<std::string> common;
  bool first = true;
  for (const ArgInfo& a : in) {
    if (!a.defined) continue;
    std::vector<std::string> p = a.spec.partial;
    std::sort(p.begin(), p.end());
    if (first) {
      common = p;
      first = false;
    } else if (common != p) {
      return {};
    }
  }
  return common;
}

}  // namespace

RuleResult elementwise(const std::vector<ArgInfo>& in, const MeshShape& mesh, Linearity linearity, bool first_only) {
  int rank = 0;
  for (const ArgInfo& a : in)
    if (a.defined) rank = std::max(rank, a.shape.ndim());
  // Output dims (right-aligned) take the split of the largest input that has the full
  // extent there; then other inputs fill dims still unsplit with axes still unused.
  std::vector<size_t> order(in.size());
  for (size_t i = 0; i < in.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return numel(in[x]) > numel(in[y]); });
  std::vector<std::vector<std::string>> out_dims(static_cast<size_t>(rank));
  std::set<std::string> used;
  for (size_t i : order) {
    const ArgInfo& a = in[i];
    if (!a.defined) continue;
    for (int d = 0; d < a.shape.ndim(); ++d) {
      const auto& axes = a.spec.axes_of(d);
      int o = rank - a.shape.ndim() + d;
      if (axes.empty() || !out_dims[size_t(o)].empty()) continue;
      bool free = std::none_of(axes.begin(), axes.end(), [&](const std::string& x) { return used.count(x); });
      if (!free) continue;
      out_dims[size_t(o)] = axes;
      used.insert(axes.begin(), axes.end());
    }
  }
  // Partial sums.
  std::vector<std::string> partial;
  if (linearity == Linearity::additive) {
    partial = common_partial(in);
  } else if (linearity == Linearity::scaling) {
    // Exactly one input (the first, for division) may stay partial.
    size_t count = 0, which = 0;
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i].defined && !in[i].spec.partial.empty()) {
        ++count;
        which = i;
      }
    if (count == 1 && (!first_only || which == 0)) partial = in[which].spec.partial;
  }
  for (const std::string& p : partial)
    if (used.count(p)) partial.clear();
  RuleResult r;
  r.output.dims = out_dims;
  r.output = r.output.with_partial(partial);
  for (const ArgInfo& a : in) {
    if (!a.defined) {
      r.inputs.emplace_back();
      continue;
    }
    PartitionSpec s;
    for (int d = 0; d < a.shape.ndim(); ++d) {
      int o = rank - a.shape.ndim() + d;
      bool broadcast = a.shape[d] == 1 && rank > 0;
      s.dims.push_back(broadcast ? std::vector<std::string>{} : out_dims[size_t(o)]);
    }
    bool keep_partial = !partial.empty() && !a.spec.partial.empty();
    if (keep_partial) s = s.with_partial(partial);
    r.inputs.push_back(s);
  }
  return r;
}

RuleResult matmul(const std::vector<ArgInfo>& in, const MeshShape& mesh, bool ta, bool tb) {
  const ArgInfo &a = in[0], &b = in[1];
  const int ra = a.shape.ndim(), rb = b.shape.ndim();
  const int am = ta ? ra - 1 : ra - 2, ak = ta ? ra - 2 : ra - 1;
  const int bk = tb ? rb - 1 : rb - 2, bn = tb ? rb - 2 : rb - 1;
  const int batch = std::max(ra, rb) - 2;
  PartitionSpec sa = a.spec.without_partial().padded(ra), sb = b.spec.without_partial().padded(rb);
  // Batch dims (right-aligned): a's layout wins (activations keep theirs); b's fills the
  // rest with axes still free; both operands then follow the output where they have extent.
  std::vector<std::vector<std::string>> out_batch(static_cast<size_t>(batch));
  std::set<std::string> used;
  auto free_axes = [&](const std::vector<std::string>& axes) {
    return std::none_of(axes.begin(), axes.end(), [&](const std::string& x) { return used.count(x); });
  };
  for (int d = 0; d < ra - 2; ++d)
    if (a.shape[d] != 1) {
      out_batch[size_t(batch - (ra - 2) + d)] = sa.dims[size_t(d)];
      used.insert(sa.dims[size_t(d)].begin(), sa.dims[size_t(d)].end());
    }
  for (int d = 0; d < rb - 2; ++d) {
    auto& o = out_batch[size_t(batch - (rb - 2) + d)];
    if (b.shape[d] != 1 && o.empty() && free_axes(sb.dims[size_t(d)]) &&
        std::none_of(sb.dims[size_t(d)].begin(), sb.dims[size_t(d)].end(),
                     [&](const std::string& x) { return sa.dim_of(x) >= 0; })) {
      o = sb.dims[size_t(d)];
      used.insert(o.begin(), o.end());
    }
  }
  for (int d = 0; d < ra - 2; ++d) sa.dims[size_t(d)] = a.shape[d] != 1 ? out_batch[size_t(batch - (ra - 2) + d)] : std::vector<std::string>{};
  for (int d = 0; d < rb - 2; ++d) sb.dims[size_t(d)] = b.shape[d] != 1 ? out_batch[size_t(batch - (rb - 2) + d)] : std::vector<std::string>{};
  // M keeps a's split; an axis already used by a (batch, M) cannot also split b.
  used.insert(sa.dims[size_t(am)].begin(), sa.dims[size_t(am)].end());
  auto drop_used = [&](std::vector<std::string>& axes) {
    if (std::any_of(axes.begin(), axes.end(), [&](const std::string& x) { return used.count(x); })) axes.clear();
  };
  // Contraction: the split both sides agree on gives partial sums. If only one side is
  // split, cut the other locally to match (free).
  std::vector<std::string> k_axes = sa.dims[size_t(ak)];
  if (k_axes.empty()) {
    k_axes = sb.dims[size_t(bk)];
    drop_used(k_axes);
  }
  sa.dims[size_t(ak)] = k_axes;
  sb.dims[size_t(bk)] = k_axes;
  used.insert(k_axes.begin(), k_axes.end());
  drop_used(sb.dims[size_t(bn)]);
  used.insert(sb.dims[size_t(bn)].begin(), sb.dims[size_t(bn)].end());
  // Partial inputs: bilinear, so one partial operand passes through; two are not allowed.
  std::vector<std::string> partial = k_axes;
  const bool pa = !a.spec.partial.empty(), pb = !b.spec.partial.empty();
  if (pa && !pb) {
    bool clash = std::any_of(a.spec.partial.begin(), a.spec.partial.end(), [&](const std::string& x) { return used.count(x); });
    if (!clash) {
      sa = sa.with_partial(a.spec.partial);
      partial.insert(partial.end(), a.spec.partial.begin(), a.spec.partial.end());
    }
  } else if (pb && !pa) {
    bool clash = std::any_of(b.spec.partial.begin(), b.spec.partial.end(), [&](const std::string& x) { return used.count(x); });
    if (!clash) {
      sb = sb.with_partial(b.spec.partial);
      partial.insert(partial.end(), b.spec.partial.begin(), b.spec.partial.end());
    }
  }
  RuleResult r;
  r.inputs = {sa, sb};
  r.output.dims = out_batch;
  r.output.dims.push_back(sa.dims[size_t(am)]);
  r.output.dims.push_back(sb.dims[size_t(bn)]);
  r.output = r.output.with_partial(partial);
  return r;
}

RuleResult reduce_sum(const std::vector<ArgInfo>& in, const MeshShape& mesh, const std::vector<int>& axes, bool keepdims) {
  const ArgInfo& x = in[0];
  PartitionSpec s = x.spec.padded(x.shape.ndim());
  std::vector<std::string> partial = s.partial;
  RuleResult r;
  r.inputs = {s};
  for (int d = 0; d < x.shape.ndim(); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (reduced) {
      partial.insert(partial.end(), s.dims[size_t(d)].begin(), s.dims[size_t(d)].end());
      if (keepdims) r.output.dims.emplace_back();
    } else {
      r.output.dims.push_back(s.dims[size_t(d)]);
    }
  }
  r.output = r.output.with_partial(partial);
  return r;
}

RuleResult reduce_gathered(const std::vector<ArgInfo>& in, const MeshShape& mesh, const std::vector<int>& axes, bool keepdims) {
  const ArgInfo& x = in[0];
  PartitionSpec s = x.spec.without_partial().padded(x.shape.ndim());
  RuleResult r;
  for (int d = 0; d < x.shape.ndim(); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (reduced) {
      s.dims[size_t(d)].clear();
      if (keepdims) r.output.dims.emplace_back();
    } else {
      r.output.dims.push_back(s.dims[size_t(d)]);
    }
  }
  r.inputs = {s};
  return r;
}

RuleResult transpose(const std::vector<ArgInfo>& in, const MeshShape& mesh, const std::vector<int>& perm) {
  PartitionSpec s = in[0].spec.padded(in[0].shape.ndim());
  RuleResult r;
  r.inputs = {s};
  for (int p : perm) r.output.dims.push_back(s.dims[size_t(p)]);
  r.output = r.output.with_partial(s.partial);
  return r;
}

RuleResult reshape(const std::vector<ArgInfo>& in, const MeshShape& mesh, const Shape& out) {
  const Shape& x = in[0].shape;
  PartitionSpec s = in[0].spec.padded(x.ndim());
  RuleResult r;
  r.output.dims.assign(size_t(out.ndim()), {});
  for (int d = 0; d < x.ndim(); ++d) {
    if (s.dims[size_t(d)].empty()) continue;
    int64_t blocks = mesh.blocks(s.axes_of(d));
    int64_t prefix = 1;
    for (int i = 0; i < d; ++i) prefix *= x[i];
    // The output dim starting at the same flat offset carries the split if it divides.
    int64_t acc = 1;
    int target = -1;
    for (int o = 0; o < out.ndim(); ++o) {
      if (acc == prefix && out[o] % blocks == 0 && out[o] > 1) {
        target = o;
        break;
      }
      acc *= out[o];
      if (acc > prefix) break;
    }
    if (target >= 0) {
      // Blocks must also end at the same place: the input block spans in[d]/blocks rows of
      // the trailing size; the output one out[o]/blocks of its own.
      int64_t rest_in = 1, rest_out = 1;
      for (int i = d + 1; i < x.ndim(); ++i) rest_in *= x[i];
      for (int i = target + 1; i < out.ndim(); ++i) rest_out *= out[i];
      if (x[d] * rest_in == out[target] * rest_out || (x[d] / blocks) * rest_in == (out[target] / blocks) * rest_out) {
        r.output.dims[size_t(target)] = s.dims[size_t(d)];
        continue;
      }
    }
    s.dims[size_t(d)].clear();  // no contiguous counterpart: gather this dim first
  }
  r.inputs = {s};
  r.output = r.output.with_partial(s.partial);
  return r;
}

RuleResult gather_dims(const std::vector<ArgInfo>& in, const MeshShape& mesh, const std::vector<int>& dims, bool allow_partial) {
  const ArgInfo& x = in[0];
  PartitionSpec s = (allow_partial ? x.spec : x.spec.without_partial()).padded(x.shape.ndim());
  for (int d : dims) s.dims[size_t(d)].clear();
  RuleResult r;
  r.inputs.push_back(s);
  for (size_t i = 1; i < in.size(); ++i) r.inputs.emplace_back();
  r.output = s;
  return r;
}

RuleResult concatenate(const std::vector<ArgInfo>& in, const MeshShape& mesh, int axis) {
  PartitionSpec s = in[largest(in)].spec.without_partial().padded(in[largest(in)].shape.ndim());
  s.dims[size_t(axis)].clear();
  RuleResult r;
  r.inputs.assign(in.size(), s);
  r.output = s;
  return r;
}

RuleResult broadcast_to(const std::vector<ArgInfo>& in, const MeshShape& mesh, const Shape& shape) {
  const ArgInfo& x = in[0];
  PartitionSpec s = x.spec.padded(x.shape.ndim());
  RuleResult r;
  r.output.dims.assign(size_t(shape.ndim()), {});
  for (int d = 0; d < x.shape.ndim(); ++d) {
    int o = shape.ndim() - x.shape.ndim() + d;
    if (x.shape[d] == shape[o]) r.output.dims[size_t(o)] = s.dims[size_t(d)];
    else s.dims[size_t(d)].clear();
  }
  r.output = r.output.with_partial(s.partial);
  r.inputs = {s};
  return r;
}

RuleResult embedding(const std::vector<ArgInfo>& in, const MeshShape& mesh) {
  // The ids keep their (batch) split and the table gives up any axis they use: an FSDP
  // table split over the data axis is gathered, as FSDP means, rather than the batch (which
  // would leave every later activation whole over the batch and split over features).
  PartitionSpec ids = in[1].spec.without_partial().padded(in[1].shape.ndim());
  PartitionSpec t = in[0].spec.without_partial().padded(2).without_axes(ids.used_axes());
  RuleResult r;
  r.inputs = {t, ids};
  r.output.dims = ids.dims;
  r.output.dims.push_back(t.dims[1]);
  r.output = r.output.with_partial(t.dims[0]);
  return r;
}

RuleResult cross_entropy(const std::vector<ArgInfo>& in, const MeshShape& mesh, bool summed) {
  const int n = in[0].shape.ndim();
  PartitionSpec logits = in[0].spec.without_partial().padded(n);
  logits.dims[size_t(n - 1)].clear();
  PartitionSpec labels;
  labels.dims.assign(logits.dims.begin(), logits.dims.end() - 1);
  RuleResult r;
  r.inputs = {logits, labels};
  if (summed) r.output = PartitionSpec{}.with_partial(labels.used_axes());
  else r.output = labels;
  return r;
}

RuleResult vocab_parallel_statistics(const std::vector<ArgInfo>& in, const MeshShape& mesh) {
  const int n = in[0].shape.ndim();
  PartitionSpec logits = in[0].spec.without_partial().padded(n);
  PartitionSpec labels;
  labels.dims.assign(logits.dims.begin(), logits.dims.end() - 1);
  RuleResult r;
  r.inputs = {logits, labels};
  PartitionSpec per_row = labels;  // (..., 1): the row maxima
  per_row.dims.emplace_back();
  for (size_t i = 2; i < in.size(); ++i) r.inputs.push_back(per_row);
  r.output.dims = per_row.dims;
  r.output = r.output.with_partial(logits.dims.back());
  return r;
}

RuleResult replicate_all(const std::vector<ArgInfo>& in, const MeshShape& mesh) {
  RuleResult r;
  r.inputs.assign(in.size(), PartitionSpec{});
  return r;
}

}  // namespace rules
}  // namespace mt::layout
