// Activation checkpointing (mt::checkpoint, models' --remat block): the recomputed backward
// gives the stored path's loss and every gradient bit for bit (dropout included, keys being
// counter-based), holds less memory, refuses traced arrays it was not given, and nests.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "meshtrain/models/bert.h"
#include "meshtrain/prim/dispatch.h"
#include "meshtrain/models/chunked_lm_loss.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/llama.h"
#include "meshtrain/models/lora.h"
#include "meshtrain/models/minigpt.h"
#include "meshtrain/models/pretrained.h"
#include "tests/support/model_twins.h"

namespace mt::testing {
namespace {

using namespace mt::models;
using json = nlohmann::json;

void expect_bitwise(const Array& a, const Array& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  std::vector<float> x = a.to_floats(), y = b.to_floats();
  size_t differ = 0;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) ++differ, worst = std::max(worst, double(std::abs(x[i] - y[i])));
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << x.size() << " values differ, max " << worst;
}

void expect_same_grads(const Params& a, const Params& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [path, g] : a) expect_bitwise(g, b[path], what + " d/d" + path);
}

// A small two-layer block with dropout: the function checkpointed below.
Array mlp_block(const Params& p, const Array& x) {
  Array h = gelu(add(matmul(x, p["w1"]), p["b1"]));
  h = dropout(h, 0.25, RngKey{7, 1}, true);
  return add(x, matmul(h, p["w2"]));
}

Params mlp_params() {
  return Params{{"w1", random_normal({6, 10}, 1)}, {"b1", random_normal({10}, 2)}, {"w2", random_normal({10, 6}, 3)}};
}

TEST(Remat, CheckpointGivesTheStoredGradientsBitForBit) {
  Params p = mlp_params();
  Array x = random_normal({4, 6}, 4);
  auto loss = [&](bool remat) {
    return [&, remat](const Params& q) {
      Array h = q["x"];
      const Params weights{{"w1", q["w1"]}, {"b1", q["b1"]}, {"w2", q["w2"]}};
      auto body = [](const Params& bp, const std::vector<Array>& xs) { return mlp_block(bp, xs[0]); };
      for (int i = 0; i < 3; ++i) h = remat ? checkpoint(body, weights, {h}) : mlp_block(q, h);
      return sum(square(h));
    };
  };
  Params all = p;
  all.set("x", x);
  auto [stored, g_stored] = value_and_grad(loss(false))(all);
  auto [remat, g_remat] = value_and_grad(loss(true))(all);
  expect_bitwise(remat, stored, "loss");
  expect_same_grads(g_remat, g_stored, "checkpointed mlp");
  EXPECT_GT(std::abs(g_stored["w1"].to_floats()[0]), 0.0f);
}

TEST(Remat, CheckpointRefusesATracedArrayItWasNotGiven) {
  Params p = mlp_params();
  Array x = random_normal({4, 6}, 4);
  auto leaky = [&](const Params& q) {
    // w2 is read from the enclosing trace, not passed in: its gradient would be lost.
    Array y = checkpoint(
        [&q](const Params& bp, const std::vector<Array>& xs) {
          return matmul(gelu(matmul(xs[0], bp["w1"])), q["w2"]);
        },
        Params{{"w1", q["w1"]}}, {x});
    return sum(y);
  };
  try {
    value_and_grad(leaky)(p);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not among its params or inputs"), std::string::npos) << e.what();
  }
}

TEST(Remat, NestedGradientsThroughACheckpointMatchTheStoredPath) {
  Params p = mlp_params();
  Array x = random_normal({4, 6}, 4);
  auto inner = [&](bool remat) {
    return [&, remat](const Params& q) {
      Array y = remat ? checkpoint([](const Params& bp, const std::vector<Array>& xs) { return mlp_block(bp, xs[0]); },
                                   q, {x})
                      : mlp_block(q, x);
      return sum(square(y));
    };
  };
  auto outer = [&](bool remat) {
    return [&, remat](const Params& q) {
      Params g = grad(inner(remat))(q);
      return sum(square(g["w1"]));
    };
  };
  Params a = grad(outer(false))(p), b = grad(outer(true))(p);
  expect_same_grads(b, a, "second order");
}

// Loss and gradients of `apply` with the config's remat off and on; also the allocator's
// peak bytes of each, which the recomputation must lower.
struct RematRun {
  Array loss;
  Params grads;
  size_t peak = 0;
};
template <class Config, class Apply>
RematRun run_model(Config c, Remat remat, const Params& p, const Apply& apply) {
  c.remat = remat;
  CachingAllocator::instance().reset_peak();
  const size_t before = CachingAllocator::instance().stats().bytes_in_use;
  auto [loss, grads] = value_and_grad([&](const Params& q) { return apply(c, q); })(p);
  return {loss, grads, CachingAllocator::instance().stats().peak_bytes_in_use - before};
}

template <class Config, class Apply>
void check_model(const std::string& name, const Config& c, const Params& p, const Apply& apply) {
  RematRun stored = run_model(c, Remat::none, p, apply);
  RematRun block = run_model(c, Remat::block, p, apply);
  expect_bitwise(block.loss, stored.loss, name + " loss");
  expect_same_grads(block.grads, stored.grads, name);
  std::cout << "  " << name << ": peak bytes stored " << stored.peak << ", remat block " << block.peak << " ("
            << double(block.peak) / double(stored.peak) << "x)\n";
  EXPECT_LT(block.peak, stored.peak) << name;
}

Array lm_loss(const Array& logits, const Array& ids) {
  const int64_t t = ids.dim(1);
  return cross_entropy(slice(logits, 1, 0, t - 1), slice(ids, 1, 1, t));
}

TEST(Remat, Gpt2WithDropoutPaddingAndLoraEqualsTheStoredPath) {
  Gpt2Config c;
  c.vocab_size = 41, c.n_positions = 32, c.n_embd = 24, c.n_layer = 3, c.n_head = 4;
  c.lora.rank = 2, c.lora.alpha = 4.0, c.lora.dropout = 0.1;
  std::vector<ParamDef> defs = gpt2_param_defs(c);
  for (ParamDef& d : lora_param_defs(gpt2_param_defs(c), c.lora, gpt2_model_spec().lora_targets)) defs.push_back(d);
  Params p = random_model_params(defs, 11);
  Array ids = random_ints({3, 32}, 12, 0, c.vocab_size);
  Array mask = Array::ones({3, 32}, DType::i64);
  check_model("gpt2+lora", c, p, [&](const Gpt2Config& cc, const Params& q) {
    return lm_loss(gpt2_apply(cc, q, {.input_ids = ids, .attention_mask = mask}, RngKey{5, 0}, true), ids);
  });
}

TEST(Remat, BertLlamaAndMiniGptEqualTheStoredPath) {
  {
    BertConfig c;
    c.vocab_size = 37, c.hidden_size = 24, c.num_hidden_layers = 3, c.num_attention_heads = 4;
    c.intermediate_size = 48, c.max_position_embeddings = 32, c.head = BertHead::sequence_classification;
    c.num_labels = 3;
    Params p = random_model_params(bert_param_defs(c), 21);
    Array ids = random_ints({4, 32}, 22, 0, c.vocab_size);
    std::vector<int64_t> m(4 * 32, 1);
    for (int i = 20; i < 32; ++i) m[size_t(3 * 32 + i)] = 0;
    Array mask = Array::from_vector(m, Shape{4, 32});
    Array labels = Array::from_vector(std::vector<int64_t>{0, 2, 1, 2}, Shape{4});
    check_model("bert classifier", c, p, [&](const BertConfig& cc, const Params& q) {
      BertInputs in;
      in.input_ids = ids, in.attention_mask = mask;
      return cross_entropy(bert_apply(cc, q, in, RngKey{6, 0}, true).logits, labels);
    });
  }
  {
    LlamaConfig c;
    c.vocab_size = 33, c.hidden_size = 32, c.intermediate_size = 48, c.num_hidden_layers = 3;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.attention_dropout = 0.1;
    Params p = random_model_params(llama_param_defs(c), 31);
    Array ids = random_ints({2, 32}, 32, 0, c.vocab_size);
    check_model("llama gqa", c, p, [&](const LlamaConfig& cc, const Params& q) {
      return lm_loss(llama_apply(cc, q, {.input_ids = ids}, RngKey{7, 0}, true), ids);
    });
  }
  {
    MiniGptConfig c;
    c.vocab_size = 29, c.maxlen = 32, c.embed_dim = 16, c.num_heads = 2, c.feed_forward_dim = 32;
    c.num_transformer_blocks = 3;
    Params p = random_model_params(minigpt_param_defs(c), 41);
    Array ids = random_ints({4, 32}, 42, 0, c.vocab_size);
    check_model("minigpt", c, p, [&](const MiniGptConfig& cc, const Params& q) {
      return lm_loss(minigpt_apply(cc, q, {.input_ids = ids}, RngKey{8, 0}, true), ids);
    });
  }
}

// Largest |a - b| over both trees, relative to the largest |b|.
double max_rel_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (const auto& [path, g] : b) {
    std::vector<float> x = a[path].to_floats(), y = g.to_floats();
    double scale = 1e-12;
    for (float v : y) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double(x[i]) - y[i]) / scale);
  }
  return worst;
}

TEST(Remat, ChunkedHeadLossEqualsTheWholeLogitsLoss) {
  Gpt2Config c;
  c.vocab_size = 301, c.n_positions = 16, c.n_embd = 16, c.n_layer = 1, c.n_head = 2;
  Params p = random_model_params(gpt2_param_defs(c), 51);
  const int64_t b = 3, t = 16;
  Array ids = random_ints({b, t}, 52, 0, c.vocab_size);
  std::vector<int64_t> lv = random_ints({b, t}, 53, 0, c.vocab_size).to_ints();
  for (int i = 0; i < 7; ++i) lv[size_t(i * 5)] = -100;  // ignored positions leave the mean
  Array labels = Array::from_vector(lv, Shape{b, t});
  auto whole = [&](const Params& q) { return cross_entropy(gpt2_apply(c, q, {.input_ids = ids}, RngKey{1, 0}, true), labels); };
  auto [ref, ref_grads] = value_and_grad(whole)(p);
  // Four chunks (the most positions a chunk takes), chunks of 3 positions (the last one
  // shorter), one position per chunk.
  for (int64_t chunk : {int64_t(1) << 24, 3 * b * c.vocab_size, b * c.vocab_size}) {
    auto chunked = [&](const Params& q) {
      HeadFn head = [&c](const Params& hp, const Array& h) { return gpt2_head(c, hp, h); };
      return chunked_lm_loss(gpt2_hidden(c, q, {.input_ids = ids}, RngKey{1, 0}, true), labels, head,
                             q.with_prefix("transformer.wte."), chunk);
    };
    auto [loss, grads] = value_and_grad(chunked)(p);
    const double loss_err = std::abs(loss.item() - ref.item()), grad_err = max_rel_diff(grads, ref_grads);
    std::cout << "  chunk of " << chunk << " logits: loss err " << loss_err << ", max grad err (relative) " << grad_err
              << "\n";
    EXPECT_LE(loss_err, 1e-6 * std::abs(ref.item()));
    EXPECT_LE(grad_err, 1e-5);
  }
  // Every target ignored (a prompt-only batch): the mean is NaN, as the whole-logits loss and
  // torch give, and every gradient 0 (the split-rows mean gave NaN gradients; this one, now
  // through the same target_mean, is kept at 0).
  const Array none = Array::full({b, t}, -100, DType::i64);
  auto [empty_loss, empty_grads] = value_and_grad([&](const Params& q) {
    HeadFn head = [&c](const Params& hp, const Array& h) { return gpt2_head(c, hp, h); };
    return chunked_lm_loss(gpt2_hidden(c, q, {.input_ids = ids}, RngKey{1, 0}, true), none, head,
                           q.with_prefix("transformer.wte."), 3 * b * c.vocab_size);
  })(p);
  EXPECT_TRUE(std::isnan(empty_loss.item()));
  for (const auto& [path, g] : empty_grads)
    for (float v : g.to_floats()) ASSERT_EQ(v, 0.0f) << path << " with every target ignored";
}

TEST(Remat, FullRematKeepsTheLossAndGradientsAndLowersThePeak) {
  const std::vector<json> configs = {
      {{"model_type", "gpt2"}, {"vocab_size", 2003}, {"n_positions", 32}, {"n_embd", 16}, {"n_layer", 2}, {"n_head", 2}},
      {{"model_type", "llama"}, {"vocab_size", 2003}, {"hidden_size", 16}, {"intermediate_size", 32},
       {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1}},
      {{"model_type", "llama"}, {"vocab_size", 2003}, {"hidden_size", 16}, {"intermediate_size", 32},
       {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"tie_word_embeddings", true}}};
  for (const json& config : configs) {
    PretrainedModel m = init_model(config);
    const std::string name = m.model_type + (config.contains("tie_word_embeddings") ? " tied" : "");
    // 72 x 32 positions: 4.6M logits, past the 4Mi a --remat full chunk holds at most (a
    // plain head's loss is chunked under every policy, in larger chunks outside full).
    Array ids = random_ints({72, 32}, 61, 0, 2003), labels = random_ints({72, 32}, 62, 0, 2003);
    auto run = [&](Remat remat) {
      PretrainedModel r = m;
      r.config = m.config.with_remat(remat);
      CachingAllocator::instance().reset_peak();
      const size_t before = CachingAllocator::instance().stats().bytes_in_use;
      auto [loss, grads] = value_and_grad([&](const Params& q) {
        return r.decoder_loss(q, {.input_ids = ids}, labels, RngKey{3, 0}, true);
      })(m.params);
      return RematRun{loss, grads, CachingAllocator::instance().stats().peak_bytes_in_use - before};
    };
    RematRun stored = run(Remat::none), block = run(Remat::block), full = run(Remat::full);
    expect_bitwise(block.loss, stored.loss, name + " block loss");
    const double grad_err = max_rel_diff(full.grads, stored.grads);
    std::cout << "  " << name << ": peak bytes none " << stored.peak << ", block " << block.peak << ", full " << full.peak
              << "; full loss err " << std::abs(full.loss.item() - stored.loss.item()) << ", max grad err (relative) "
              << grad_err << "\n";
    EXPECT_LE(std::abs(full.loss.item() - stored.loss.item()), 1e-6 * std::abs(stored.loss.item())) << name;
    EXPECT_LE(grad_err, 1e-5) << name;
    EXPECT_LT(full.peak, block.peak) << name;
  }
}

// A plain head (GPT-2's tied embedding, LLaMA's lm_head or tied embedding) runs with its loss
// as one linear_cross_entropy: the loss and every gradient equal the whole logits' loss, with
// remat or without. A head with more than a product (an adapter on lm_head) keeps the
// composed form.
TEST(Remat, DecoderLossRunsAPlainHeadWithItsLoss) {
  const std::vector<std::pair<json, std::string>> configs = {
      {{{"model_type", "gpt2"}, {"vocab_size", 2003}, {"n_positions", 32}, {"n_embd", 16}, {"n_layer", 2}, {"n_head", 2}},
       "transformer.wte.weight"},
      {{{"model_type", "llama"}, {"vocab_size", 2003}, {"hidden_size", 16}, {"intermediate_size", 32},
        {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1}},
       "lm_head.weight"},
      {{{"model_type", "llama"}, {"vocab_size", 2003}, {"hidden_size", 16}, {"intermediate_size", 32},
        {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"tie_word_embeddings", true}},
       "model.embed_tokens.weight"}};
  for (const auto& [config, head] : configs) {
    PretrainedModel m = init_model(config);
    ASSERT_TRUE(m.spec().linear_head);
    EXPECT_EQ(m.spec().linear_head(m.config, m.params).weight, head);
    std::vector<int64_t> lv = random_ints({4, 32}, 64, 0, 2003).to_ints();
    for (int i = 0; i < 9; ++i) lv[size_t(i * 13)] = -100;
    const Array ids = random_ints({4, 32}, 63, 0, 2003), labels = Array::from_vector(lv, Shape{4, 32});
    auto [ref, ref_grads] = value_and_grad([&](const Params& q) {
      return cross_entropy(m.decoder_logits(q, {.input_ids = ids}, RngKey{5, 0}, true), labels);
    })(m.params);
    for (Remat remat : {Remat::none, Remat::full}) {
      PretrainedModel r = m;
      r.config = m.config.with_remat(remat);
      auto [loss, grads] = value_and_grad([&](const Params& q) {
        return r.decoder_loss(q, {.input_ids = ids}, labels, RngKey{5, 0}, true);
      })(m.params);
      const double grad_err = max_rel_diff(grads, ref_grads);
      std::cout << "  " << m.model_type << " head " << head << " remat " << remat_name(remat) << ": loss err "
                << std::abs(loss.item() - ref.item()) << ", max grad err (relative) " << grad_err << "\n";
      EXPECT_LE(std::abs(loss.item() - ref.item()), 1e-6 * std::abs(ref.item())) << head;
      EXPECT_LE(grad_err, 1e-5) << head;
    }
  }
  // An adapter (or anything besides the weight) under lm_head: not a plain product.
  PretrainedModel llama = init_model(configs[1].first);
  Params adapted = llama.params;
  adapted.set("lm_head.lora_A.weight", Array::zeros({2, 16}));
  EXPECT_FALSE(llama.spec().linear_head(llama.config, adapted).linear());
}

// Encoder-decoders' linear heads run with their loss as one linear_cross_entropy too: BART's
// (tied or not) with its final_logits_bias as the product's bias (nonzero here, and given a
// gradient), T5's tied head with its d_model^-1/2 scale and its untied lm_head. The loss and
// every gradient equal the whole logits' loss, with remat or without.
TEST(Remat, Seq2SeqLossRunsALinearHeadWithItsLoss) {
  const json bart = {{"model_type", "bart"}, {"vocab_size", 1001}, {"d_model", 16}, {"encoder_layers", 1},
                     {"decoder_layers", 1}, {"encoder_ffn_dim", 32}, {"decoder_ffn_dim", 32},
                     {"encoder_attention_heads", 2}, {"decoder_attention_heads", 2}, {"max_position_embeddings", 32}};
  const json t5 = {{"model_type", "t5"}, {"vocab_size", 1001}, {"d_model", 16}, {"d_kv", 8}, {"d_ff", 32},
                   {"num_layers", 1}, {"num_heads", 2}};
  json bart_untied = bart, t5_untied = t5;
  bart_untied["tie_word_embeddings"] = false, t5_untied["tie_word_embeddings"] = false;
  const std::vector<std::pair<json, std::string>> configs = {{bart, "model.shared.weight"},
                                                             {bart_untied, "lm_head.weight"},
                                                             {t5, "shared.weight"},
                                                             {t5_untied, "lm_head.weight"}};
  for (const auto& [config, head] : configs) {
    PretrainedModel m = init_model(config);
    ASSERT_TRUE(m.spec().linear_head);
    EXPECT_EQ(m.spec().linear_head(m.config, m.params).weight, head);
    if (m.params.contains("final_logits_bias")) m.params.set("final_logits_bias", random_normal({1, 1001}, 91));
    if (m.params.contains("lm_head.weight")) {  // an adapter on lm_head: more than a product
      Params adapted = m.params;
      adapted.set("lm_head.lora_A.weight", Array::zeros({2, 16}));
      EXPECT_FALSE(m.spec().linear_head(m.config, adapted).linear()) << m.model_type;
    }
    std::vector<int64_t> lv = random_ints({3, 12}, 92, 0, 1001).to_ints();
    for (int i = 0; i < 5; ++i) lv[size_t(i * 7)] = -100;
    Seq2SeqInputs in;
    in.input_ids = random_ints({3, 10}, 93, 0, 1001), in.decoder_input_ids = random_ints({3, 12}, 94, 0, 1001);
    const Array labels = Array::from_vector(lv, Shape{3, 12});
    auto [ref, ref_grads] = value_and_grad([&](const Params& q) {
      return cross_entropy(m.seq2seq_logits(q, in, RngKey{6, 0}, true), labels);
    })(m.params);
    for (Remat remat : {Remat::none, Remat::full}) {
      PretrainedModel r = m;
      r.config = m.config.with_remat(remat);
      std::map<std::string, int> calls;
      prim::OpObserver previous = prim::set_op_observer([&](const prim::OpEvent& e) { ++calls[e.primitive.name()]; });
      auto [loss, grads] = value_and_grad([&](const Params& q) {
        return r.seq2seq_loss(q, in, labels, RngKey{6, 0}, true);
      })(m.params);
      prim::set_op_observer(previous);
      EXPECT_EQ(calls["linear_cross_entropy"], 1) << m.model_type << " " << head;
      const double grad_err = max_rel_diff(grads, ref_grads);
      std::cout << "  " << m.model_type << " head " << head << " remat " << remat_name(remat) << ": loss err "
                << std::abs(loss.item() - ref.item()) << ", max grad err (relative) " << grad_err << "\n";
      EXPECT_LE(std::abs(loss.item() - ref.item()), 1e-6 * std::abs(ref.item())) << head;
      EXPECT_LE(grad_err, 1e-5) << head;
    }
  }
}

TEST(Remat, PolicyNames) {
  EXPECT_EQ(parse_remat("block"), Remat::block);
  EXPECT_STREQ(remat_name(parse_remat("full")), "full");
  EXPECT_THROW(parse_remat("blocks"), Error);
}

}  // namespace
}  // namespace mt::testing
