// Every op under sharding equals the single-device result: inputs are sharded with several
// layouts on 1-D and 2-D meshes, the op runs on global arrays (communication inserted by the
// sharding rules), and the gathered output and input gradients are compared with the same
// op on the unsharded arrays. Run under mpirun with 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/host_reads.h"
#include "meshtrain/distributed/mesh.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/prim/dispatch.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using dist::Mesh;
using dist::PartitionSpec;

// The meshes a world of this size supports: 1-D over all ranks, and 2-D ones for 4 and 8.
std::vector<Mesh> meshes() {
  int n = dist::world().size();
  std::vector<Mesh> out{Mesh::from_string("data=" + std::to_string(n))};
  if (n >= 4 && n % 2 == 0) out.push_back(Mesh::from_string("data=" + std::to_string(n / 2) + ",model=2"));
  if (n == 8) out.push_back(Mesh::from_string("data=2,model=4"));
  return out;
}

// Whether `spec` applies to this mesh and shape (axes exist, dims divide); layouts that do
// not are skipped for that mesh.
bool fits(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape) {
  for (const auto& a : spec.used_axes())
    if (!mesh.has_axis(a)) return false;
  dist::Sharding s{mesh, spec};
  for (int d = 0; d < spec.ndim() && d < shape.ndim(); ++d)
    if (shape[d] % s.num_blocks(d) != 0) return false;
  return true;
}

// Runs fn on host inputs and on inputs sharded by `specs` (one per input); compares the
// output and the VJP of a fixed cotangent.
void check_sharded(const std::string& label, const OpFn& fn, const std::vector<Array>& host,
                   const std::vector<std::string>& specs, double tol = 1e-5) {
  Array probe = fn(host);
  const bool grads = is_floating(probe.dtype());
  Array cot = grads ? random_normal(probe.shape(), 99, probe.dtype()) : Array();
  Array ref_out = probe;
  std::vector<Array> ref_grads;
  if (grads) std::tie(ref_out, ref_grads) = vjp(fn, host, cot);
  for (const Mesh& mesh : meshes()) {
    std::vector<Array> sharded;
    bool ok = true;
    for (size_t i = 0; i < host.size(); ++i) {
      PartitionSpec spec = PartitionSpec::parse(i < specs.size() ? specs[i] : "");
      if (!fits(mesh, spec, host[i].shape())) ok = false;
      if (ok) sharded.push_back(dist::shard(host[i], mesh, spec, "x" + std::to_string(i)));
    }
    if (!ok) continue;
    std::string where = label + " on " + mesh.str();
    Array out;
    std::vector<Array> g;
    if (grads) {
      std::tie(out, g) = vjp(fn, sharded, cot);
    } else {
      out = fn(sharded);
    }
    double err = max_abs_diff(dist::to_host(out), ref_out);
    for (size_t i = 0; i < g.size(); ++i)
      if (is_floating(host[i].dtype())) err = std::max(err, max_abs_diff(dist::to_host(g[i]), ref_grads[i]));
    if (dist::world().rank() == 0) std::cout << "  [max err] " << where << ": " << err << "\n";
    EXPECT_LE(err, tol) << where;
  }
}

TEST(SpmdOps, Elementwise) {
  Array a = random_normal({8, 12}, 1), b = random_normal({8, 12}, 2), row = random_normal({12}, 3);
  Array pos = random_uniform({8, 12}, 4, 0.5, 2.0);
  for (const char* sa : {"data,None", "None,data", "data,model", "model,data"}) {
    for (const char* sb : {"data,None", "None,data", "", "None,model"}) {
      check_sharded(std::string("add ") + sa + " + " + sb, [](auto& x) { return add(x[0], x[1]); }, {a, b}, {sa, sb});
      check_sharded(std::string("mul ") + sa + " * " + sb, [](auto& x) { return mul(x[0], x[1]); }, {a, b}, {sa, sb});
    }
    check_sharded(std::string("div bcast ") + sa, [](auto& x) { return div(x[0], x[1]); }, {a, pos}, {sa, sa});
    check_sharded(std::string("sub row ") + sa, [](auto& x) { return sub(x[0], x[1]); }, {a, row}, {sa, ""});
    check_sharded(std::string("gelu ") + sa, [](auto& x) { return gelu(x[0]); }, {a}, {sa});
    check_sharded(std::string("where ") + sa,
                  [](auto& x) { return where(gt(x[0], x[1]), x[0], exp(x[1])); }, {a, b}, {sa, sa});
  }
}

TEST(SpmdOps, Reductions) {
  Array x = random_normal({4, 8, 6}, 5);
  for (const char* s : {"data,None,None", "None,data,None", "data,model,None", "None,None,model"}) {
    for (std::vector<int> axes : {std::vector<int>{0}, {1}, {2}, {0, 2}, {}}) {
      std::string ax;
      for (int a : axes) ax += std::to_string(a);
      check_sharded(std::string("sum ") + s + " axes " + ax, [axes](auto& v) { return sum(v[0], axes); }, {x}, {s});
      check_sharded(std::string("mean keep ") + s + " axes " + ax, [axes](auto& v) { return mean(v[0], axes, true); },
                    {x}, {s});
      check_sharded(std::string("max ") + s + " axes " + ax, [axes](auto& v) { return max(v[0], axes); }, {x}, {s});
    }
    check_sharded(std::string("logsumexp ") + s, [](auto& v) { return logsumexp(v[0], {-1}); }, {x}, {s});
    check_sharded(std::string("argmax ") + s, [](auto& v) { return argmax(v[0], 1); }, {x}, {s});
  }
}

TEST(SpmdOps, ShapeOps) {
  Array x = random_normal({4, 6, 8}, 6);
  for (const char* s : {"data,None,None", "None,data,None", "None,None,data", "data,None,model"}) {
    check_sharded(std::string("reshape merge ") + s, [](auto& v) { return reshape(v[0], {24, 8}); }, {x}, {s});
    check_sharded(std::string("reshape split ") + s, [](auto& v) { return reshape(v[0], {4, 6, 2, 4}); }, {x}, {s});
    check_sharded(std::string("reshape flat ") + s, [](auto& v) { return reshape(v[0], {-1}); }, {x}, {s});
    check_sharded(std::string("transpose ") + s, [](auto& v) { return transpose(v[0], {2, 0, 1}); }, {x}, {s});
    check_sharded(std::string("slice ") + s, [](auto& v) { return slice(v[0], 1, 1, 5); }, {x}, {s});
    check_sharded(std::string("concat ") + s, [](auto& v) { return concatenate({v[0], mul(v[0], 2.0)}, 2); }, {x}, {s});
    check_sharded(std::string("broadcast ") + s,
                  [](auto& v) { return broadcast_to(expand_dims(v[0], 1), Shape{4, 2, 6, 8}); }, {x}, {s});
  }
}

TEST(SpmdOps, MatmulLayouts) {
  Array a = random_normal({8, 12}, 7), b = random_normal({12, 16}, 8);
  Array x3 = random_normal({4, 8, 12}, 9);
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"data,None", ""},          {"None,data", "data,None"}, {"", "None,data"},      {"data,None", "None,model"},
      {"data,model", "model,None"}, {"None,model", "model,None"}, {"data,None", "data,None"}, {"", "model,data"}};
  for (const auto& [sa, sb] : layouts) {
    check_sharded("matmul " + sa + " @ " + sb, [](auto& v) { return matmul(v[0], v[1]); }, {a, b}, {sa, sb}, 2e-5);
    check_sharded("matmul^T " + sa + " @ " + sb, [](auto& v) { return matmul(v[0], transpose(v[1], {1, 0}), false, true); },
                  {a, b}, {sa, sb}, 2e-5);
  }
  for (const char* s : {"data,None,None", "None,data,model", "data,None,model"})
    check_sharded(std::string("batched x W ") + s, [](auto& v) { return matmul(v[0], v[1]); }, {x3, b}, {s, "None,model"},
                  2e-5);
}

TEST(SpmdOps, NormsSoftmaxEmbeddingLoss) {
  Array x = random_normal({4, 6, 8}, 10), w = random_normal({8}, 11), bias = random_normal({8}, 12);
  for (const char* s : {"data,None,None", "None,None,data", "data,model,None"}) {
    check_sharded(std::string("softmax ") + s, [](auto& v) { return softmax(v[0], -1); }, {x}, {s});
    check_sharded(std::string("log_softmax axis1 ") + s, [](auto& v) { return log_softmax(v[0], 1); }, {x}, {s});
    check_sharded(std::string("layer_norm ") + s, [](auto& v) { return layer_norm(v[0], v[1], v[2]); }, {x, w, bias},
                  {s, "", ""});
    check_sharded(std::string("rms_norm ") + s, [](auto& v) { return rms_norm(v[0], v[1]); }, {x, w}, {s, "data"});
  }
  Array table = random_normal({16, 8}, 13);
  Array ids = random_ints({4, 6}, 14, 0, 16);
  for (const char* st : {"data,None", "None,data", "", "model,None"})
    for (const char* si : {"", "data,None", "None,model"})
      check_sharded(std::string("embedding ") + st + " ids " + si, [](auto& v) { return embedding(v[0], v[1]); },
                    {table, ids}, {st, si});
  Array logits = random_normal({4, 6, 10}, 15);
  Array labels = random_ints({4, 6}, 16, 0, 10);
  std::vector<int64_t> lv = labels.to_ints();
  lv[3] = -100;
  labels = Array::from_vector(lv, {4, 6});
  for (const char* s : {"data,None,None", "None,data,None", "data,None,model", "None,None,data"}) {
    check_sharded(std::string("cross_entropy mean ") + s, [](auto& v) { return cross_entropy(v[0], v[1]); },
                  {logits, labels}, {s, ""});
    check_sharded(std::string("cross_entropy smoothed sum ") + s,
                  [](auto& v) { return cross_entropy(v[0], v[1], -100, 0.1, Reduction::sum); }, {logits, labels},
                  {s, "data,None"});
  }
}

// The fused head and loss with rows split over ranks: each rank runs the chunked op on its
// rows against the whole weight (gathered when FSDP splits it, even over its second dim),
// equal to one device with ignored targets, smoothing and a bias; a class-split weight on an
// axis the rows do not use keeps the composed vocabulary-parallel form.
TEST(SpmdOps, LinearCrossEntropySplitRowsEqualOneDevice) {
  const Array hidden = random_normal({4, 6, 8}, 40), weight = random_normal({12, 8}, 41), bias = random_normal({12}, 42);
  std::vector<int64_t> lv = random_ints({4, 6}, 43, 0, 12).to_ints();
  lv[5] = -100;
  const Array labels = Array::from_vector(lv, {4, 6});
  for (const char* hs : {"data,None,None", "None,data,None", "data,model,None"})
    for (const char* ws : {"", "data,None", "None,data", "model,None"}) {
      const std::string where = std::string(" hidden ") + hs + " weight " + ws;
      const char* bs = std::string(ws) == "model,None" ? "model" : std::string(ws) == "data,None" ? "data" : "";
      check_sharded("linear_cross_entropy mean, smoothed, bias" + where,
                    [](auto& v) { return linear_cross_entropy(v[0], v[1], v[2], -100, 0.1, Reduction::mean, 24, v[3]); },
                    {hidden, weight, labels, bias}, {hs, ws, "", bs});
      check_sharded("linear_cross_entropy sum" + where,
                    [](auto& v) { return linear_cross_entropy(v[0], v[1], v[2], -100, 0.0, Reduction::sum, 24); },
                    {hidden, weight, labels}, {hs, ws, ""});
      // Equal values alone would not tell the routes apart: which primitives ran says it. The
      // fused op runs when every axis splitting the weight also splits the rows.
      const bool fused = std::string(ws) != "model,None" || std::string(hs) == "data,model,None";
      for (const Mesh& mesh : meshes()) {
        const PartitionSpec h_spec = PartitionSpec::parse(hs), w_spec = PartitionSpec::parse(ws);
        if (!fits(mesh, h_spec, hidden.shape()) || !fits(mesh, w_spec, weight.shape())) continue;
        const Array h = dist::shard(hidden, mesh, h_spec, "hidden"), w = dist::shard(weight, mesh, w_spec, "weight");
        const Array y = dist::shard(labels, mesh, PartitionSpec{}, "labels");
        std::map<std::string, int> ran;
        {
          // Restored however the block ends, so no later test meets an observer of a dead map.
          struct ObserverScope {
            prim::OpObserver previous;
            ~ObserverScope() { prim::set_op_observer(previous); }
          } scope{prim::set_op_observer([&](const prim::OpEvent& e) { ++ran[e.primitive.name()]; })};
          vjp([](auto& v) { return linear_cross_entropy(v[0], v[1], v[2], -100, 0.0, Reduction::mean, 24); },
              {h, w, y}, Array::scalar(1.0));
        }
        const std::string at = where + " on " + mesh.str();
        if (fused) {
          EXPECT_GT(ran["linear_cross_entropy"], 0) << at << ": the fused op did not run";
          EXPECT_EQ(ran["cross_entropy"] + ran["vocab_parallel_statistics"], 0) << at << ": the composed form ran";
        } else {
          EXPECT_EQ(ran["linear_cross_entropy"], 0) << at << ": the fused op ran on a class-split weight";
          EXPECT_GT(ran["vocab_parallel_statistics"], 0) << at << ": the vocabulary-parallel form did not run";
        }
      }
    }
}

// A batch whose targets are all ignored (a prompt-only SFT batch, say): the mean is NaN, as
// one device and torch give, and the gradients are 0 as one device gives — the mean over
// split rows divided 0 by a count of 0 and made every gradient NaN, which poisons AdamW's
// moments for the rest of the run.
TEST(SpmdOps, MeanOverSplitRowsWithEveryTargetIgnoredHasZeroGradients) {
  const Array logits = random_normal({4, 6, 12}, 60), hidden = random_normal({4, 6, 8}, 61);
  const Array weight = random_normal({12, 8}, 62);
  const Array labels = Array::full({4, 6}, -100, DType::i64);
  struct Case {
    std::string label;
    std::function<Array(const std::vector<Array>&)> fn;
    std::vector<Array> host;
    std::vector<std::string> specs;
  };
  std::vector<Case> cases;
  for (const char* s : {"data,None,None", "data,None,model", "None,None,data"})
    cases.push_back({std::string("cross_entropy ") + s, [](auto& v) { return cross_entropy(v[0], v[1], -100, 0.1); },
                     {logits, labels}, {s, ""}});
  for (const char* ws : {"", "data,None"})
    cases.push_back({std::string("linear_cross_entropy hidden data,None,None weight ") + ws,
                     [](auto& v) { return linear_cross_entropy(v[0], v[1], v[2], -100, 0.0, Reduction::mean, 24); },
                     {hidden, weight, labels}, {"data,None,None", ws, ""}});
  for (const Case& c : cases) {
    auto [ref, ref_grads] = vjp(c.fn, c.host, Array::scalar(1.0));
    ASSERT_TRUE(std::isnan(ref.item())) << c.label << ": one device's mean is not NaN";
    for (const Mesh& mesh : meshes()) {
      std::vector<Array> sharded;
      bool ok = true;
      for (size_t i = 0; i < c.host.size() && ok; ++i) {
        PartitionSpec spec = PartitionSpec::parse(c.specs[i]);
        ok = fits(mesh, spec, c.host[i].shape());
        if (ok) sharded.push_back(dist::shard(c.host[i], mesh, spec, "x" + std::to_string(i)));
      }
      if (!ok) continue;
      auto [loss, grads] = vjp(c.fn, sharded, Array::scalar(1.0));
      const std::string where = c.label + " on " + mesh.str();
      EXPECT_TRUE(std::isnan(dist::to_host(loss).item())) << where;
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!is_floating(c.host[i].dtype())) continue;
        const Array g = dist::to_host(grads[i]);
        EXPECT_EQ(max_abs_diff(g, ref_grads[i]), 0.0) << where << ", gradient " << i;
        for (float v : g.to_floats()) ASSERT_TRUE(v == 0.0f) << where << ", gradient " << i << " holds " << v;
      }
    }
  }
}

// FSDP's head without its logits: per rank, the op holds a few rows of logits, not the
// (rows, V) logits and their gradient the composed form made (2 MB each here).
TEST(SpmdOps, LinearCrossEntropyUnderFsdpNeverHoldsTheLogits) {
  const int n = dist::world().size();
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  const int64_t rows = 512, vocab = 1024, width = 16;
  const Array hidden = dist::shard(random_normal({n * rows, width}, 44), mesh, PartitionSpec{"data", ""}, "hidden");
  const Array labels = dist::shard(random_ints({n * rows}, 45, 0, vocab), mesh, PartitionSpec{"data"}, "labels");
  Params p{{"w", dist::shard(random_normal({vocab, width}, 46), mesh, PartitionSpec{"data", ""}, "w")}};
  CachingAllocator::instance().reset_peak();
  const double before = double(CachingAllocator::instance().stats().bytes_in_use);
  auto [loss, grads] = value_and_grad([&](const Params& q) {
    return linear_cross_entropy(hidden, q["w"], labels, -100, 0.0, Reduction::mean, 8 * vocab);
  })(p);
  const double peak = double(CachingAllocator::instance().stats().peak_bytes_in_use) - before;
  const double logits_bytes = double(rows * vocab * 4);
  if (dist::world().rank() == 0)
    std::cout << "  FSDP linear_cross_entropy: peak " << peak / 1e6 << " MB above the start (logits: "
              << logits_bytes / 1e6 << " MB)\n";
  EXPECT_LT(peak, logits_bytes / 2);
  EXPECT_TRUE(std::isfinite(dist::to_host(loss).item()));
  if (n > 1) {
    EXPECT_EQ(dist::sharding_of(grads["w"])->spec, (PartitionSpec{"data", ""}));
  }
}

TEST(SpmdOps, DropoutAndInitMatchSingleDevice) {
  Array x = random_normal({8, 12}, 17);
  RngKey key{3, 7};
  for (const char* s : {"data,None", "None,data", "data,model"})
    check_sharded(std::string("dropout ") + s, [key](auto& v) { return dropout(v[0], 0.3, key, true); }, {x}, {s});
  for (const Mesh& mesh : meshes())
    for (const char* s : {"data,None", "None,data", "data,model"}) {
      PartitionSpec spec = PartitionSpec::parse(s);
      if (!fits(mesh, spec, Shape{8, 12})) continue;
      Array sharded = dist::random_normal(key, {8, 12}, dist::Sharding{mesh, spec});
      EXPECT_EQ(max_abs_diff(dist::to_host(sharded), random_normal(key, {8, 12})), 0.0) << s << " on " << mesh.str();
    }
}

TEST(SpmdOps, IndexingOpsAndCastsEqualOneDevice) {
  Array x = random_normal({8, 12}, 80);
  Array idx = random_ints({4, 2}, 81, 0, 12);
  Array rows = random_ints({8, 3}, 82, 0, 12);
  Array ids = random_ints({8, 4}, 83, 0, 12);
  for (const char* s : {"data,None", "None,data", "data,model"}) {
    check_sharded(std::string("take ") + s, [](auto& v) { return take(v[0], v[1], 1); }, {x, idx}, {s, ""});
    check_sharded(std::string("take_along_axis ") + s, [](auto& v) { return take_along_axis(v[0], v[1], 1); }, {x, rows},
                  {s, "data,None"});
    check_sharded(std::string("top_k values ") + s, [](auto& v) { return top_k(v[0], 3, -1).first; }, {x}, {s});
    check_sharded(std::string("cast bf16 ") + s, [](auto& v) { return cast(cast(v[0], DType::bf16), DType::f32); }, {x}, {s});
    check_sharded(std::string("one_hot ") + s, [](auto& v) { return one_hot(v[0], 12); }, {ids}, {s});
  }
}

TEST(SpmdOps, DifferentiableCollectivesOnLocalBlocks) {
  const int n = dist::world().size(), r = dist::world().rank();
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  Array x = random_normal({2, 3}, 40 + uint64_t(r));  // a different block on every rank
  Array w = random_normal({2 * n, 3}, 50);
  // all_gather -> reduce_scatter: rank r' weighs the gathered value by (r' + 1) · w, so the
  // gradient of rank r's block is Σ_r' (r' + 1) · w[block r].
  auto [y, g] = vjp([&](const std::vector<Array>& in) { return sum(mul(dist::all_gather(in[0], mesh, "data", 0), mul(w, double(r + 1)))); },
                    {x}, Array::scalar(1.0));
  Array expected = mul(slice(w, 0, 2 * r, 2 * r + 2), double(n * (n + 1) / 2));
  EXPECT_LE(max_abs_diff(g[0], expected), 1e-5);
  // all_reduce -> identity.
  Array v = random_normal({2, 3}, 60);
  auto [z, h] = vjp([&](const std::vector<Array>& in) { return sum(mul(dist::all_reduce(in[0], mesh, "data"), v)); }, {x},
                    Array::scalar(1.0));
  EXPECT_LE(max_abs_diff(h[0], v), 1e-6);
  // reduce_scatter -> all_gather.
  Array big = random_normal({2 * n, 3}, 70 + uint64_t(r));
  auto [rs, k] = vjp([&](const std::vector<Array>& in) { return sum(mul(dist::reduce_scatter(in[0], mesh, "data", 0), mul(v, double(r + 1)))); },
                     {big}, Array::scalar(1.0));
  Array all_v;
  for (int q = 0; q < n; ++q) all_v = all_v.defined() ? concatenate({all_v, mul(v, double(q + 1))}, 0) : mul(v, double(q + 1));
  EXPECT_LE(max_abs_diff(k[0], all_v), 1e-5);
  if (n > 1)
    expect_error([&] { dist::reduce_scatter(Array::zeros({2 * n + 1, 3}), mesh, "data", 0); },
                 {"[reduce_scatter]", "not divisible"});
}

// A partial sum moved to another split that stays partial keeps every rank's term: an
// embedding over a vocab-split table with whole ids (partial over model, batch whole) added
// to a row-parallel product (partial over model, batch split over data). Redistribution once
// zeroed the terms of all but the first model rank here, a silent wrong sum (found by
// T5 under data=2,model=2).
TEST(SpmdOps, PartialSumsKeepTheirTermsWhenTheSplitChanges) {
  for (const Mesh& mesh : meshes()) {
    if (!mesh.has_axis("model")) continue;
    Array table = random_normal({48, 32}, 3), ids = random_ints({8, 5}, 4, 0, 48);
    Array h = random_normal({8, 5, 32}, 5), w = random_normal({32, 32}, 6);
    auto S = [&](const Array& x, const char* spec) { return dist::shard(x, mesh, PartitionSpec::parse(spec)); };
    Array e = embedding(S(table, "model,None"), S(ids, "None"));
    Array y = matmul(S(h, "data,None,model"), S(w, "None,model"), false, true);
    ASSERT_TRUE(dist::sharding_of(e)->spec.is_partial("model") && dist::sharding_of(y)->spec.is_partial("model"));
    const Array want = add(embedding(table, ids), matmul(h, w, false, true));
    const double err = max_abs_diff(dist::to_host(add(e, y)), want);
    const double moved = max_abs_diff(
        dist::to_host(dist::redistribute(e, PartitionSpec::parse("data,None,None|partial=model"))), embedding(table, ids));
    if (dist::world().rank() == 0)
      std::cout << "  [max err] partial + partial on " << mesh.str() << ": " << err << ", partial re-split " << moved << "\n";
    EXPECT_LE(err, 1e-5);
    EXPECT_EQ(moved, 0.0);
    // The vocab-split lookup forms its local rows on the ids' device: no host read, forward or
    // backward (a GPU step would wait for its stream at each one).
    const Array sharded_table = S(table, "model,None"), whole_ids = S(ids, "None");
    const uint64_t before = host_read_count();
    auto [value, grads] = value_and_grad([&](const Params& p) { return sum(embedding(p["table"], whole_ids)); })(
        Params{{"table", sharded_table}});
    EXPECT_EQ(host_read_count() - before, 0u) << mesh.str();
    EXPECT_NEAR(value.item(), sum(embedding(table, ids)).item(), 1e-3);
  }
}

TEST(SpmdOps, BadLayoutsAreClearErrorsOnEveryRank) {
  Mesh mesh = meshes()[0];
  Array x = Array::zeros({3, 5});
  if (dist::world().size() > 1) {
    expect_error([&] { dist::shard(x, mesh, PartitionSpec::parse("data,None"), "encoder.weight"); },
                 {"encoder.weight", "dimension 0", "(3, 5)", "not divisible"});
  }
  expect_error([&] { dist::shard(x, mesh, PartitionSpec::parse("None,tensor"), "w"); }, {"unknown mesh axis 'tensor'"});
  expect_error([&] { dist::shard(x, mesh, PartitionSpec::parse("data,data"), "w"); }, {"used twice"});
}

}  // namespace
}  // namespace mt::testing
