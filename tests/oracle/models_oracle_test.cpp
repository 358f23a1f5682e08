// Each model (BERT + classification / MLM heads, GPT-2, miniGPT, LLaMA with GQA and both
// rotary conventions) against a PyTorch twin written with torch.nn.functional over the same
// weights: logits and the gradient of every parameter, with padding masks.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/models/bert.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/llama.h"
#include "meshtrain/models/minigpt.h"
#include "tests/support/model_twins.h"

namespace mt::testing {
namespace {

using namespace mt::models;

Params randomize(const std::vector<ParamDef>& defs, uint64_t seed, double scale = 0.3) {
  return random_model_params(defs, seed, scale);
}

Array ids_array(const std::vector<int64_t>& v, int64_t b, int64_t t) { return Array::from_vector(v, Shape{b, t}); }

TEST(ModelsOracle, Gpt2TiedHeadWithLeftPadding) {
  Gpt2Config c;
  c.vocab_size = 37, c.n_positions = 16, c.n_embd = 12, c.n_layer = 2, c.n_head = 3;
  Params p = randomize(gpt2_param_defs(c), 100);
  const int64_t b = 2, t = 7;
  Array ids = random_ints({b, t}, 5, 0, c.vocab_size);
  Array mask = ids_array({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, b, t);
  std::string call = "gpt2_twin(P, X[0], X[1], 2, 3, 1e-5)";
  check_twin("gpt2 left-padded", p, {ids, mask},
             [&](const Params& q) { return gpt2_apply(c, q, {.input_ids = ids, .attention_mask = mask}); }, call);
  check_twin("gpt2 no mask", p, {ids}, [&](const Params& q) { return gpt2_apply(c, q, {.input_ids = ids}); },
             "gpt2_twin(P, X[0], None, 2, 3, 1e-5)");
}

TEST(ModelsOracle, BertSequenceClassificationWithPaddingMask) {
  BertConfig c;
  c.vocab_size = 41, c.hidden_size = 12, c.num_hidden_layers = 2, c.num_attention_heads = 3;
  c.intermediate_size = 20, c.max_position_embeddings = 16, c.num_labels = 3;
  c = c.with_head(BertHead::sequence_classification);
  Params p = randomize(bert_param_defs(c), 200);
  const int64_t b = 3, t = 6;
  Array ids = random_ints({b, t}, 6, 0, c.vocab_size);
  Array mask = ids_array({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0}, b, t);
  Array types = ids_array({0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0}, b, t);
  BertInputs in{.input_ids = ids, .attention_mask = mask, .token_type_ids = types};
  TwinErrors e = check_twin("bert classifier", p, {ids, mask, types},
                            [&](const Params& q) { return bert_apply(c, q, in).logits; },
                            "bert_twin(P, X[0], X[1], X[2], 2, 3, 1e-12, 'cls')");
  EXPECT_LT(e.logits, 1e-5);
}

TEST(ModelsOracle, BertMaskedLmHeadTiedToWordEmbeddings) {
  BertConfig c;
  c.vocab_size = 23, c.hidden_size = 8, c.num_hidden_layers = 1, c.num_attention_heads = 2;
  c.intermediate_size = 16, c.max_position_embeddings = 8;
  c = c.with_head(BertHead::masked_lm);
  Params p = randomize(bert_param_defs(c), 300);
  EXPECT_FALSE(p.contains("bert.pooler.dense.weight"));
  const int64_t b = 2, t = 5;
  Array ids = random_ints({b, t}, 7, 0, c.vocab_size);
  Array mask = ids_array({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, b, t);
  BertInputs in{.input_ids = ids, .attention_mask = mask};
  check_twin("bert mlm", p, {ids, mask}, [&](const Params& q) { return bert_apply(c, q, in).logits; },
             "bert_twin(P, X[0], X[1], torch.zeros_like(X[0]), 1, 2, 1e-12, 'mlm')");
}

TEST(ModelsOracle, MiniGptPostLayerNormReluBlocks) {
  MiniGptConfig c;
  c.vocab_size = 29, c.maxlen = 16, c.embed_dim = 12, c.num_heads = 3, c.feed_forward_dim = 16;
  c.num_transformer_blocks = 2;
  Params p = randomize(minigpt_param_defs(c), 400);
  const int64_t b = 2, t = 6;
  Array ids = random_ints({b, t}, 8, 0, c.vocab_size);
  check_twin("minigpt", p, {ids}, [&](const Params& q) { return minigpt_apply(c, q, {.input_ids = ids}); },
             "minigpt_twin(P, X[0], None, 2, 3, 1e-6)");
  Array mask = ids_array({0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, b, t);
  check_twin("minigpt left-padded", p, {ids, mask},
             [&](const Params& q) { return minigpt_apply(c, q, {.input_ids = ids, .attention_mask = mask}); },
             "minigpt_twin(P, X[0], X[1], 2, 3, 1e-6)");
}

TEST(ModelsOracle, LlamaGroupedQueryAttentionBothRotaryConventions) {
  for (bool interleaved : {false, true})
    for (bool tied : {false, true}) {
      LlamaConfig c;
      c.vocab_size = 33, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
      c.num_attention_heads = 4, c.num_key_value_heads = 2, c.rms_norm_eps = 1e-5, c.rope_theta = 500.0;
      c.rope_interleaved = interleaved, c.tie_word_embeddings = tied;
      Params p = randomize(llama_param_defs(c), 500);
      EXPECT_EQ(p.contains("lm_head.weight"), !tied);
      const int64_t b = 2, t = 7;
      Array ids = random_ints({b, t}, 9, 0, c.vocab_size);
      Array mask = ids_array({0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, b, t);
      std::string label = std::string("llama gqa 4/2 ") + (interleaved ? "interleaved" : "half-split") +
                          (tied ? " tied" : " untied");
      check_twin(label, p, {ids, mask},
                 [&](const Params& q) { return llama_apply(c, q, {.input_ids = ids, .attention_mask = mask}); },
                 std::string("llama_twin(P, X[0], X[1], 2, 4, 2, 1e-5, 500.0, ") + (interleaved ? "True" : "False") +
                     ")");
    }
}

TEST(ModelsOracle, DropoutOnlyInTrainingAndKeyed) {
  MiniGptConfig c;
  c.vocab_size = 19, c.maxlen = 8, c.embed_dim = 8, c.num_heads = 2, c.feed_forward_dim = 8;
  c.num_transformer_blocks = 2;
  Params p = minigpt_init(c, {3, 0});
  Array ids = random_ints({2, 5}, 10, 0, c.vocab_size);
  Array eval1 = minigpt_apply(c, p, {.input_ids = ids}, {1, 0}, false);
  Array eval2 = minigpt_apply(c, p, {.input_ids = ids}, {2, 0}, false);
  expect_close(eval1, eval2, {0, 0}, "eval ignores the dropout key");
  Array tr1 = minigpt_apply(c, p, {.input_ids = ids}, {1, 0}, true);
  Array tr1b = minigpt_apply(c, p, {.input_ids = ids}, {1, 0}, true);
  Array tr2 = minigpt_apply(c, p, {.input_ids = ids}, {2, 0}, true);
  expect_close(tr1, tr1b, {0, 0}, "training dropout reproducible from the key");
  auto a = tr1.to_floats(), e = eval1.to_floats(), d = tr2.to_floats();
  double diff_eval = 0, diff_key = 0;
  for (size_t i = 0; i < a.size(); ++i) diff_eval = std::max(diff_eval, double(std::abs(a[i] - e[i]))),
                                        diff_key = std::max(diff_key, double(std::abs(a[i] - d[i])));
  std::cout << "  train vs eval max diff " << diff_eval << ", key 1 vs key 2 " << diff_key << "\n";
  EXPECT_GT(diff_eval, 1e-3);
  EXPECT_GT(diff_key, 1e-3);
  c.dropout_rate = 0;
  expect_close(minigpt_apply(c, p, {.input_ids = ids}, {1, 0}, true), eval1, {0, 0}, "rate 0 training == eval");
  // GPT-2 and BERT train with dropout too (keys reach every site).
  Gpt2Config g;
  g.vocab_size = 19, g.n_positions = 8, g.n_embd = 8, g.n_layer = 1, g.n_head = 2;
  Params gp = gpt2_init(g, {4, 0});
  Array gt = gpt2_apply(g, gp, {.input_ids = ids}, {1, 0}, true), ge = gpt2_apply(g, gp, {.input_ids = ids});
  EXPECT_GT(std::abs(gt.to_floats()[0] - ge.to_floats()[0]) + std::abs(gt.to_floats()[5] - ge.to_floats()[5]), 0.0);
}

}  // namespace
}  // namespace mt::testing
