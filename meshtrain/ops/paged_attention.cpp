#include "meshtrain/ops/paged_attention.h"

#include <cmath>

#include "meshtrain/backend/kernel_dispatch.h"
#include "meshtrain/core/error.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/prim/registry.h"

namespace mt {

MT_REGISTER_PRIMITIVES("paged attention", {"kv_pool_like", "paged_kv_write", "paged_attention"});

namespace {

// Everything whole except the heads (dim 1), split as `heads_of`'s dim 1 is: each rank keeps
// the keys and values of its own heads.
layout::PartitionSpec split_heads_as(const layout::PartitionSpec& heads_of) {
  layout::PartitionSpec spec;
  spec.dims.assign(4, {});
  spec.dims[1] = heads_of.axes_of(1);
  return spec;
}

void check_kv(const Array& kv, const char* op) {
  MT_CHECK(kv.ndim() == 4 && is_floating(kv.dtype()), "[", op, "] expects floating (B, Hkv, T, D) keys or values, got ",
           kv.str());
}

void check_pool(const Array& pool, const char* op) {
  MT_CHECK(pool.ndim() == 4 && is_floating(pool.dtype()) && pool.dim(2) > 0, "[", op,
           "] expects a floating (blocks, Hkv, block_size, D) pool, got ", pool.str());
}

class KvPoolPrimitive final : public prim::Primitive {
 public:
  KvPoolPrimitive(int64_t blocks, int64_t block_size) : blocks_(blocks), block_size_(block_size) {}
  const char* name() const override { return "kv_pool_like"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    check_kv(in[0], "kv_pool_like");
    return {Shape{blocks_, in[0].dim(1), block_size_, in[0].dim(3)}, in[0].dtype()};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    return Array::empty(o.shape, o.dtype, in[0].device());
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape&) const override {
    const layout::PartitionSpec spec = split_heads_as(in[0].spec);
    return {{spec}, spec};
  }
  prim::Cost cost(const std::vector<Array>&, const prim::OutputInfo&) const override { return {0, 0}; }

 private:
  int64_t blocks_, block_size_;
};

class PagedKvWritePrimitive final : public prim::Primitive {
 public:
  explicit PagedKvWritePrimitive(std::vector<int64_t> slots) : slots_(std::move(slots)) {}
  const char* name() const override { return "paged_kv_write"; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    const Array &pool = in[0], &kv = in[1];
    check_pool(pool, "paged_kv_write");
    check_kv(kv, "paged_kv_write");
    MT_CHECK(kv.dtype() == pool.dtype() && kv.dim(1) == pool.dim(1) && kv.dim(3) == pool.dim(3),
             "[paged_kv_write] keys or values ", kv.str(), " do not fit the pool ", pool.str());
    MT_CHECK(int64_t(slots_.size()) == kv.dim(0) * kv.dim(2), "[paged_kv_write] ", slots_.size(), " slots for ",
             kv.str(), " (B·T = ", kv.dim(0) * kv.dim(2), ")");
    const int64_t capacity = pool.dim(0) * pool.dim(2);
    for (int64_t s : slots_)
      MT_CHECK(s >= 0 && s < capacity, "[paged_kv_write] slot ", s, " outside the pool ", pool.str(), " of ",
               capacity, " positions");
    return {pool.shape(), pool.dtype()};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = in[0].view_as_shape(o.shape);  // the pool's storage: the write is the point
    MT_KERNEL(out, paged_kv_write, out, in[1], slots_);
    return out;
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape&) const override {
    const layout::PartitionSpec spec = split_heads_as(in[0].spec);
    return {{spec, spec}, spec};
  }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    return {0, 2.0 * double(in[1].nbytes())};
  }

 private:
  std::vector<int64_t> slots_;
};

class PagedAttentionPrimitive final : public prim::Primitive {
 public:
  PagedAttentionPrimitive(PagedRows rows, double scale) : rows_(std::move(rows)), scale_(scale) {}
  const char* name() const override { return "paged_attention"; }
  prim::OpKind kind() const override { return prim::OpKind::attention; }
  prim::OutputInfo infer(const std::vector<Array>& in) const override {
    const Array &q = in[0], &k = in[1], &v = in[2];
    check_pool(k, "paged_attention");
    MT_CHECK(q.ndim() == 4 && q.dim(2) == 1 && q.dtype() == k.dtype() && k.shape() == v.shape() &&
                 k.dtype() == v.dtype() && q.dim(3) == k.dim(3) && k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0,
             "[paged_attention] expects q (B, H, 1, D) and pools (blocks, Hkv, block_size, D) of one dtype with H a "
             "multiple of Hkv, got q ",
             q.str(), ", keys ", k.str(), ", values ", v.str());
    const int64_t b = q.dim(0), capacity = rows_.max_blocks * k.dim(2);
    MT_CHECK(int64_t(rows_.lengths.size()) == b && int64_t(rows_.block_table.size()) == b * rows_.max_blocks,
             "[paged_attention] ", rows_.lengths.size(), " lengths and a block table of ", rows_.block_table.size(),
             " entries for ", b, " rows of ", rows_.max_blocks, " blocks");
    for (int64_t i = 0; i < b; ++i)
      MT_CHECK(rows_.lengths[size_t(i)] >= 1 && rows_.lengths[size_t(i)] <= capacity, "[paged_attention] row ", i,
               " attends to ", rows_.lengths[size_t(i)], " positions; its blocks hold 1 to ", capacity);
    for (int64_t blk : rows_.block_table)
      MT_CHECK(blk >= 0 && blk < k.dim(0), "[paged_attention] block ", blk, " outside the pool ", k.str());
    return {q.shape(), q.dtype()};
  }
  Array run(const std::vector<Array>& in, const prim::OutputInfo& o, std::vector<Array>&) const override {
    Array out = Array::empty(o.shape, o.dtype, in[0].device());
    const float scale = float(scale_ > 0 ? scale_ : 1.0 / std::sqrt(double(in[0].dim(3))));
    if (out.numel() > 0) MT_KERNEL(out, paged_attention, in[0], in[1], in[2], rows_, scale, out);
    return out;
  }
  bool differentiable(const std::vector<Array>&, const prim::OutputInfo&) const override { return false; }
  layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape&) const override {
    const layout::PartitionSpec spec = split_heads_as(in[1].spec);
    return {{spec, spec, spec}, spec};
  }
  prim::Cost cost(const std::vector<Array>& in, const prim::OutputInfo&) const override {
    double positions = 0;
    for (int64_t len : rows_.lengths) positions += double(len);
    const double per_head = positions * double(in[0].dim(3));
    return {4.0 * per_head * double(in[0].dim(1)),
            2.0 * per_head * double(in[1].dim(1)) * double(dtype_size(in[1].dtype()))};
  }

 private:
  PagedRows rows_;
  double scale_;
};

}  // namespace

Array kv_pool_like(const Array& kv, int64_t blocks, int64_t block_size) {
  MT_CHECK(kv.defined(), "[kv_pool_like] undefined keys or values");
  MT_CHECK(blocks > 0 && block_size > 0, "[kv_pool_like] ", blocks, " blocks of ", block_size, " positions");
  return prim::apply(std::make_shared<KvPoolPrimitive>(blocks, block_size), {kv});
}

Array paged_kv_write(const Array& pool, const Array& kv, const std::vector<int64_t>& slots) {
  MT_CHECK(pool.defined() && kv.defined(), "[paged_kv_write] undefined pool or keys");
  return prim::apply(std::make_shared<PagedKvWritePrimitive>(slots), {pool, kv});
}

Array paged_attention(const Array& q, const Array& k_pool, const Array& v_pool, const PagedRows& rows, double scale) {
  MT_CHECK(q.defined() && k_pool.defined() && v_pool.defined(), "[paged_attention] undefined input array");
  return prim::apply(std::make_shared<PagedAttentionPrimitive>(rows, scale), {q, k_pool, v_pool});
}

}  // namespace mt
