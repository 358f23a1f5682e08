// The models built from the fused layer ops (bias + activation, residual add with dropout,
// post-norm residual step) train as the composed ops they replace: 20 SGD steps with dropout on
// give the same losses (f32: within 1e-5 relative, the GeLU gradient's last-bit differences
// and reordered bias sums being all that differ), and under bf16 one step's loss and gradients
// agree within bf16's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "meshtrain/models/bert.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/minigpt.h"
#include "meshtrain/ops/fused_ops.h"
#include "tests/support/model_twins.h"

namespace mt::testing {
namespace {

using namespace mt::models;
using LossFn = std::function<Array(const Params&, int step)>;

// Restores the process-wide switch whatever a test does.
struct FusedLayers {
  explicit FusedLayers(bool on) : previous(fused_layers()) { set_fused_layers(on); }
  ~FusedLayers() { set_fused_layers(previous); }
  bool previous;
};

std::vector<double> sgd_losses(const LossFn& loss, Params p, bool fused, int steps, double lr) {
  FusedLayers scope(fused);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    auto [value, grads] = value_and_grad([&](const Params& q) { return loss(q, s); })(p);
    losses.push_back(value.item());
    Params next;
    for (const auto& [path, w] : p) next.set(path, sub(w, mul(grads[path], lr)));
    p = next;
  }
  return losses;
}

double max_rel(const Params& a, const Params& b) {
  double worst = 0, scale = 0;
  for (const auto& [path, g] : b) {
    std::vector<float> x = a[path].to_floats(), y = g.to_floats();
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, double(std::abs(x[i] - y[i])));
      scale = std::max(scale, double(std::abs(y[i])));
    }
  }
  return worst / std::max(scale, 1e-30);
}

void check(const std::string& name, const LossFn& loss, const Params& p) {
  std::vector<double> fused = sgd_losses(loss, p, true, 20, 0.05), composed = sgd_losses(loss, p, false, 20, 0.05);
  double worst = 0;
  for (size_t i = 0; i < fused.size(); ++i) worst = std::max(worst, std::abs(fused[i] - composed[i]) / std::abs(composed[i]));
  std::printf("  %-18s f32, 20 steps: loss %.5f -> %.5f, max rel diff fused vs composed %.2e\n", name.c_str(),
              composed.front(), composed.back(), worst);
  EXPECT_LT(composed.back(), composed.front()) << name << " did not train";
  EXPECT_LE(worst, 1e-5) << name;

  // bf16: one step's loss and gradients with the parameters in bf16.
  Params half;
  for (const auto& [path, w] : p) half.set(path, cast(w, DType::bf16));
  auto grads = [&](bool on) {
    FusedLayers scope(on);
    return value_and_grad([&](const Params& q) { return cast(loss(q, 0), DType::f32); })(half);
  };
  auto [lf, gf] = grads(true);
  auto [lc, gc] = grads(false);
  const double loss_rel = std::abs(lf.item() - lc.item()) / std::abs(lc.item());
  const double grad_rel = max_rel(gf, gc);
  std::printf("  %-18s bf16: loss rel diff %.2e, gradients max diff / max |g| %.2e\n", name.c_str(), loss_rel, grad_rel);
  EXPECT_LE(loss_rel, 2e-2) << name;
  EXPECT_LE(grad_rel, 5e-2) << name;
}

Array lm_loss(const Array& logits, const Array& ids) {
  const int64_t t = ids.dim(1);
  return cross_entropy(cast(slice(logits, 1, 0, t - 1), DType::f32), slice(ids, 1, 1, t));
}

TEST(FusedModels, Gpt2TrainsAsComposed) {
  Gpt2Config c;
  c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 2, c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.1;
  Params p = random_model_params(gpt2_param_defs(c), 51);
  Array ids = random_ints({3, 32}, 52, 0, c.vocab_size);
  check("gpt2", [&](const Params& q, int s) {
    return lm_loss(gpt2_apply(c, q, {.input_ids = ids}, RngKey{5, uint64_t(s)}, true), ids);
  }, p);
}

TEST(FusedModels, BertClassifierWithPaddingTrainsAsComposed) {
  BertConfig c;
  c.vocab_size = 37, c.hidden_size = 24, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.intermediate_size = 48, c.max_position_embeddings = 32, c.head = BertHead::sequence_classification;
  c.num_labels = 3;
  Params p = random_model_params(bert_param_defs(c), 61);
  Array ids = random_ints({4, 32}, 62, 0, c.vocab_size);
  std::vector<int64_t> m(4 * 32, 1);
  for (int i = 20; i < 32; ++i) m[size_t(3 * 32 + i)] = 0;
  Array mask = Array::from_vector(m, Shape{4, 32});
  Array labels = Array::from_vector(std::vector<int64_t>{0, 2, 1, 2}, Shape{4});
  check("bert classifier", [&](const Params& q, int s) {
    BertInputs in;
    in.input_ids = ids, in.attention_mask = mask;
    return cross_entropy(cast(bert_apply(c, q, in, RngKey{6, uint64_t(s)}, true).logits, DType::f32), labels);
  }, p);
}

TEST(FusedModels, MiniGptTrainsAsComposed) {
  MiniGptConfig c;
  c.vocab_size = 29, c.maxlen = 32, c.embed_dim = 16, c.num_heads = 2, c.feed_forward_dim = 32;
  c.num_transformer_blocks = 2;
  Params p = random_model_params(minigpt_param_defs(c), 71);
  Array ids = random_ints({4, 32}, 72, 0, c.vocab_size);
  check("minigpt", [&](const Params& q, int s) {
    return lm_loss(minigpt_apply(c, q, {.input_ids = ids}, RngKey{8, uint64_t(s)}, true), ids);
  }, p);
}

}  // namespace
}  // namespace mt::testing
