// The encoder-decoders (T5 v1.0 and v1.1, BART) against PyTorch twins written in
// tests/support/model_twins.py over the same weights: teacher-forced logits and the gradient
// of every parameter, with padded sources. Also T5's relative position buckets against the
// twin's f32 formula, and the remat path against the stored one.
#include <gtest/gtest.h>

#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/models/bart.h"
#include "meshtrain/models/t5.h"
#include "meshtrain/ops/reduce.h"
#include "tests/support/model_twins.h"
#include "tests/support/torch_oracle.h"

namespace mt::testing {
namespace {

using namespace mt::models;

Array ids_array(const std::vector<int64_t>& v, int64_t b, int64_t t) { return Array::from_vector(v, Shape{b, t}); }

// Small max_distance so sources of ~10 tokens reach the logarithmic buckets.
T5Config small_t5(bool v1_1) {
  T5Config c;
  c.vocab_size = 41, c.d_model = 16, c.d_kv = 6, c.d_ff = 24, c.num_layers = 2, c.num_decoder_layers = 3;
  c.num_heads = 3, c.relative_attention_num_buckets = 8, c.relative_attention_max_distance = 12;
  c.feed_forward_proj = v1_1 ? "gated-gelu" : "relu";
  c.tie_word_embeddings = !v1_1;
  return c;
}

BartConfig small_bart() {
  BartConfig c;
  c.vocab_size = 43, c.max_position_embeddings = 32, c.d_model = 12, c.encoder_layers = 2, c.decoder_layers = 2;
  c.encoder_ffn_dim = 20, c.decoder_ffn_dim = 18, c.encoder_attention_heads = 3, c.decoder_attention_heads = 2;
  c.scale_embedding = true;
  return c;
}

TEST(Seq2SeqOracle, T5RelativeBucketsMatchTheTwin) {
  for (bool bidirectional : {true, false}) {
    std::vector<int64_t> rel;
    for (int64_t r = -300; r <= 300; ++r) rel.push_back(r);
    std::vector<float> mine;
    for (int64_t r : rel) mine.push_back(float(t5_relative_position_bucket(r, bidirectional, 32, 128)));
    OracleResult ref = TorchOracle::instance().run(
        twin_library() + "out = t5_bucket(xs[0].long(), " + (bidirectional ? "True" : "False") + ", 32, 128).double()\n",
        {to_oracle(Array::from_vector(rel, Shape{int64_t(rel.size())}))});
    double err = expect_close(Array::from_vector(mine, Shape{int64_t(mine.size())}), ref.outputs[0], {0, 0},
                              "t5 buckets");
    std::cout << "[twin] t5 buckets (bidirectional " << bidirectional << ") over [-300, 300]: max err " << err << "\n";
  }
}

void check_t5(bool v1_1, uint64_t seed) {
  const T5Config c = small_t5(v1_1);
  Params p = random_model_params(t5_param_defs(c), seed, v1_1 ? 0.15 : 0.3);
  const int64_t b = 2, s = 11, t = 9;
  Array ids = random_ints({b, s}, seed + 1, 0, c.vocab_size);
  std::vector<int64_t> m(size_t(b * s), 1);
  for (int64_t j = 7; j < s; ++j) m[size_t(s + j)] = 0;  // row 1: 7 tokens, right-padded
  Array mask = ids_array(m, b, s);
  Array dec = random_ints({b, t}, seed + 2, 0, c.vocab_size);
  const std::string call = std::string("t5_twin(P, X[0], X[1], X[2], 2, 3, 3, 1e-6, 8, 12, ") +
                           (v1_1 ? "True, False)" : "False, True)");
  check_twin(v1_1 ? "t5 v1.1 (gated-gelu, untied)" : "t5 v1.0 (relu, tied)", p, {ids, mask, dec},
             [&](const Params& q) {
               return t5_apply(c, q, {.input_ids = ids, .attention_mask = mask, .decoder_input_ids = dec});
             },
             call);
}

TEST(Seq2SeqOracle, T5V10ReluTiedHead) { check_t5(false, 300); }
TEST(Seq2SeqOracle, T5V11GatedGeluUntiedHead) { check_t5(true, 400); }

TEST(Seq2SeqOracle, BartPostLayerNormScaledEmbeddings) {
  const BartConfig c = small_bart();
  Params p = random_model_params(bart_param_defs(c), 500);
  const int64_t b = 3, s = 8, t = 6;
  Array ids = random_ints({b, s}, 501, 0, c.vocab_size);
  std::vector<int64_t> m(size_t(b * s), 1);
  for (int64_t j = 5; j < s; ++j) m[size_t(2 * s + j)] = 0;
  Array mask = ids_array(m, b, s);
  Array dec = random_ints({b, t}, 502, 0, c.vocab_size);
  check_twin("bart", p, {ids, mask, dec},
             [&](const Params& q) {
               return bart_apply(c, q, {.input_ids = ids, .attention_mask = mask, .decoder_input_ids = dec});
             },
             "bart_twin(P, X[0], X[1], X[2], 2, 2, 3, 2, True, 'gelu')");
}

// Checkpointed blocks (which read the shared position bias and the encoder output as
// inputs) give the stored path's loss bit for bit with dropout on. Gradients agree to f32
// round-off rather than bitwise: a decoder block's k and v projections of the encoder
// output are summed inside the checkpoint before joining the other layers' contributions,
// a different association of the same sum.
TEST(Seq2SeqOracle, RematBlocksEqualTheStoredPath) {
  for (bool t5 : {true, false}) {
    T5Config tc = small_t5(true);
    BartConfig bc = small_bart();
    bc.attention_dropout = 0.1, bc.activation_dropout = 0.1;
    const std::vector<ParamDef> defs = t5 ? t5_param_defs(tc) : bart_param_defs(bc);
    Params p = random_model_params(defs, 600);
    Array ids = random_ints({2, 7}, 601, 2, 40), dec = random_ints({2, 5}, 602, 2, 40);
    Array mask = ids_array({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, 2, 7);
    auto loss_with = [&](Remat r) {
      tc.remat = r, bc.remat = r;
      const Seq2SeqInputs in{.input_ids = ids, .attention_mask = mask, .decoder_input_ids = dec};
      return value_and_grad([&](const Params& q) {
        return sum(t5 ? t5_apply(tc, q, in, RngKey{7, 1}, true) : bart_apply(bc, q, in, RngKey{7, 1}, true));
      })(p);
    };
    auto [v0, g0] = loss_with(Remat::none);
    auto [v1, g1] = loss_with(Remat::block);
    EXPECT_EQ(v0.item(), v1.item());
    double worst = 0, scale = 0;
    for (const auto& [path, g] : g0) {
      std::vector<float> a = g.to_floats(), b = g1[path].to_floats();
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, double(std::abs(a[i] - b[i]))), scale = std::max(scale, double(std::abs(a[i])));
    }
    EXPECT_LE(worst, 2e-6 * scale) << (t5 ? "t5" : "bart") << ", max |grad| " << scale;
    std::cout << "[remat] " << (t5 ? "t5" : "bart") << " block vs stored: loss " << v0.item()
              << ", max |grad diff| " << worst << " of max |grad| " << scale << " over " << g0.size() << " parameters\n";
  }
}

}  // namespace
}  // namespace mt::testing
