#include "meshtrain/backend/cpu/broadcast_iter.h"

#include "meshtrain/core/error.h"

namespace mt::cpu {

int64_t BroadcastPlan::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) r *= dims[i];
  return r;
}

void BroadcastPlan::row_offsets(int64_t row, int64_t* offsets) const {
  for (size_t k = 0; k < strides.size(); ++k) offsets[k] = 0;
  for (int d = int(dims.size()) - 2; d >= 0 && row > 0; --d) {
    int64_t idx = row % dims[size_t(d)];
    row /= dims[size_t(d)];
    for (size_t k = 0; k < strides.size(); ++k) offsets[k] += idx * strides[k][size_t(d)];
  }
}

BroadcastPlan make_broadcast_plan(const Shape& out, const std::vector<Shape>& inputs) {
  MT_CHECK(inputs.size() <= 8, "[broadcast] at most 8 operands");
  const int n = out.ndim();
  // Full-rank strides per operand (0 on broadcast dims), then the output's own strides.
  std::vector<std::vector<int64_t>> full(inputs.size() + 1, std::vector<int64_t>(size_t(n), 0));
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Shape& s = inputs[k];
    std::vector<int64_t> st = s.strides();
    for (int i = 0; i < s.ndim(); ++i) {
      int o = n - s.ndim() + i;
      full[k][size_t(o)] = s[i] == 1 ? 0 : st[size_t(i)];
    }
  }
  full.back() = out.strides();
  BroadcastPlan plan;
  std::vector<std::vector<int64_t>> st(full.size());
  for (int i = 0; i < n; ++i) {
    if (out[i] == 1) continue;  // size-1 dims never move any operand
    if (!plan.dims.empty()) {
      // Merge dim i into the previous kept dim when each operand steps contiguously across.
      bool mergeable = true;
      for (size_t k = 0; k < full.size(); ++k)
        if (st[k].back() != full[k][size_t(i)] * out[i]) mergeable = false;
      if (mergeable) {
        plan.dims.back() *= out[i];
        for (size_t k = 0; k < full.size(); ++k) st[k].back() = full[k][size_t(i)];
        continue;
      }
    }
    plan.dims.push_back(out[i]);
    for (size_t k = 0; k < full.size(); ++k) st[k].push_back(full[k][size_t(i)]);
  }
  if (plan.dims.empty()) {
    plan.dims.push_back(out.numel() == 0 ? 0 : 1);
    for (auto& s : st) s.push_back(0);
  }
  st.pop_back();  // the output is always contiguous; its strides only guided merging
  plan.strides = std::move(st);
  return plan;
}

}  // namespace mt::cpu
