#include "meshtrain/ops/rotary.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/backend/rotary.h"
#include "meshtrain/core/device_constants.h"
#include "meshtrain/core/error.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/fused_ops.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("rotary", {"rotary_embedding"});

namespace {

// x rotated pair by pair by the angles whose cos and sin tables (x's dtype) come in as inputs
// 1 and 2: one pass where the composed form takes nine ops (two slices, four products, a sum,
// a difference and a concatenation) and as many again backward. The VJP is the inverse
// rotation, itself this primitive, so it nests; it keeps the tables, not x.
class RotaryPrimitive final : public prim::Primitive {
 public:
  explicit RotaryPrimitive(const kernels::RotaryShape& s) : s_(s) {}
  const char* name() const override { return "rotary_embedding"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    const Array &x = in[0], &c = in[1], &sn = in[2];
    MT_CHECK(is_floating(x.dtype()) && c.dtype() == x.dtype() && sn.dtype() == x.dtype() && c.shape() == sn.shape() &&
                 c.numel() == table_rows() * (s_.d / 2) && x.numel() == s_.outer * s_.t * s_.inner * s_.d,
             "[rotary_embedding] expects x and cos/sin tables of one floating dtype, ", table_rows(), " rows of ",
             s_.d / 2, ", got x ", x.str(), ", cos ", c.str(), ", sin ", sn.str());
    return {x.shape(), x.dtype()};
  }
  // T rows, or B·T with per-batch positions.
  int64_t table_rows() const { return s_.batches * s_.t; }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = Array::empty(o.shape, o.dtype);
    if (out.numel() > 0) MT_KERNEL(out, rotary, in[0], in[1], in[2], s_, out);
    return out;
  }
  uint32_t keeps_inputs() const override { return 0b110; }  // the tables, not x
  std::vector<Array> vjp(const prim::Saved& s, const Array& g) const override {
    kernels::RotaryShape back = s_;
    back.inverse = !s_.inverse;
    const Array gc = g.dtype() == s.dtypes[0] ? g : cast(g, s.dtypes[0]);
    return {prim::apply(std::make_shared<RotaryPrimitive>(back), {gc, s.inputs[1], s.inputs[2]}), Array(), Array()};
  }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo& o) const override {
    const double bytes = double(dtype_size(o.dtype)) * double(2 * o.shape.numel() + in[1].numel() + in[2].numel());
    return {3.0 * double(o.shape.numel()), bytes};
  }

 private:
  kernels::RotaryShape s_;
};

}  // namespace

Array rotary_embedding(const Array& x, const Array& positions, double theta, bool interleaved, bool heads_inner) {
  MT_CHECK(x.defined() && positions.defined(), "[rotary] undefined input array");
  MT_CHECK(x.ndim() >= 2 && x.dim(-1) % 2 == 0, "[rotary] expects (..., T, D) with even D, got ", x.str());
  MT_CHECK(!heads_inner || x.ndim() == 4, "[rotary] expects heads-inner x as (B, T, H, D), got ", x.str());
  MT_CHECK(is_integer(positions.dtype()), "[rotary] positions must be integers, got ", positions.str());
  const int64_t t = x.dim(heads_inner ? 1 : -2), d = x.dim(-1), half = d / 2;
  MT_CHECK((positions.ndim() == 1 && positions.dim(0) == t) ||
               (positions.ndim() == 2 && positions.dim(1) == t && x.ndim() == 4 && positions.dim(0) == x.dim(0)),
           "[rotary] positions ", positions.str(), " do not match x ", x.str(), " (expected (T,) or (B, T))");
  // Angles in f32 as Hugging Face computes them: inv_freq_i = theta^(-2i/D), angle = pos · inv_freq,
  // formed on the positions' device with ops: no host read of the positions mid-step.
  // The frequencies depend on (theta, D) alone: made once per device, not uploaded by every call.
  char key[96];
  std::snprintf(key, sizeof key, "rotary_inv_freq %.17g %lld", theta, static_cast<long long>(d));
  const Array freq = device_constant(key, positions.device(), [&] {
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv_freq[size_t(i)] = float(1.0 / std::pow(theta, double(2 * i) / double(d)));
    return Array::from_vector(inv_freq, Shape{half});
  });
  Array angles = mul(expand_dims(cast(positions, DType::f32), -1), freq);  // (T, half) or (B, T, half)
  // Integer positions are never traced: the tables carry no gradient.
  auto on_x = [&](const Array& a) { return a.device() == x.device() ? a : a.to(x.device()); };
  Array cos_t = on_x(cast(cos(angles), x.dtype())), sin_t = on_x(cast(sin(angles), x.dtype()));
  if (fused_layers() && !x.distributed()) {
    kernels::RotaryShape s;
    s.t = t, s.d = d, s.interleaved = interleaved;
    s.inner = heads_inner ? x.dim(2) : 1;
    s.outer = t * d * s.inner > 0 ? x.numel() / (t * d * s.inner) : 0;
    s.per_batch = positions.ndim() == 2;
    s.batches = s.per_batch ? positions.dim(0) : 1;
    s.outer_per_batch = s.per_batch && !heads_inner ? x.dim(1) : 1;
    return prim::apply(std::make_shared<RotaryPrimitive>(s), {x, cos_t, sin_t});
  }
  // The composed form broadcasts the tables over the heads.
  auto over_heads = [&](const Array& table) {
    if (heads_inner) return expand_dims(table, -2);                 // (T, 1, half) or (B, T, 1, half)
    return positions.ndim() == 2 ? expand_dims(table, 1) : table;  // (B, 1, T, half) or (T, half)
  };
  cos_t = over_heads(cos_t), sin_t = over_heads(sin_t);
  if (!interleaved) {
    Array x1 = slice(x, -1, 0, half), x2 = slice(x, -1, half, d);
    return concatenate({sub(mul(x1, cos_t), mul(x2, sin_t)), add(mul(x2, cos_t), mul(x1, sin_t))}, -1);
  }
  std::vector<int64_t> pairs = x.shape().dims();
  pairs.back() = half;
  pairs.push_back(2);
  Array xp = reshape(x, pairs);
  Array x0 = squeeze(slice(xp, -1, 0, 1), -1), x1 = squeeze(slice(xp, -1, 1, 2), -1);
  Array r0 = sub(mul(x0, cos_t), mul(x1, sin_t)), r1 = add(mul(x0, sin_t), mul(x1, cos_t));
  return reshape(stack({r0, r1}, -1), x.shape().dims());
}

}  // namespace mt
