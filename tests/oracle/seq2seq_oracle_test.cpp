// The encoder-decoders (T5 v1.0 and v1.1, BART) against PyTorch twins written in
// tests/support/model_twins.py over the same weights: teacher-forced logits and the gradient
// of every parameter, with padded sources. Also T5's relative position buckets against the
// twin's f32 formula, and the remat path against the stored one.
#include <gtest/gtest.h>

#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/models/bart.h"
#include "meshtrain/models/lora.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/models/seq2seq_generate.h"
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

// LoRA on encoder-decoders: adapters on self- and cross-attention (and T5's gated MLP)
// match the twin run on the merged weights W + s·B A, logits and the gradients of W, A, B.
std::vector<ParamDef> with_adapters(std::vector<ParamDef> defs, const LoraOptions& o, const std::string& targets) {
  for (ParamDef& d : lora_param_defs(defs, o, targets)) defs.push_back(d);
  return defs;
}

TEST(Seq2SeqOracle, LoraAdaptersMatchTheTwinOnMergedWeights) {
  LoraOptions o;
  o.rank = 3, o.alpha = 6.0, o.dropout = 0;
  T5Config t5 = small_t5(true);
  t5.lora = o;
  t5.lora.targets = R"(\.(SelfAttention|EncDecAttention)\.(q|v)$|DenseReluDense\.(wi_0|wo)$)";
  const auto t5_defs = with_adapters(t5_param_defs(t5), t5.lora, t5.lora.targets);
  EXPECT_EQ(t5_defs.size(), t5_param_defs(t5).size() + 2 * (2 * 2 + 3 * 4 + (2 + 3) * 2));
  Params p = random_model_params(t5_defs, 950, 0.15);
  Array ids = random_ints({2, 7}, 951, 0, t5.vocab_size);
  Array mask = ids_array({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, 2, 7);
  Array dec = random_ints({2, 5}, 952, 0, t5.vocab_size);
  check_twin("t5 v1.1 lora r3 (attention q/v + MLP wi_0/wo)", p, {ids, mask, dec},
             [&](const Params& q) {
               return t5_apply(t5, q, {.input_ids = ids, .attention_mask = mask, .decoder_input_ids = dec});
             },
             "t5_twin(lora_weights(P, 2.0, False), X[0], X[1], X[2], 2, 3, 3, 1e-6, 8, 12, True, False)");
  BartConfig bart = small_bart();
  bart.lora = o;  // PEFT's default targets for BART: q_proj and v_proj of both attentions
  const auto bart_defs = with_adapters(bart_param_defs(bart), bart.lora, bart_model_spec().lora_targets);
  EXPECT_EQ(bart_defs.size(), bart_param_defs(bart).size() + 2 * 2 * (2 + 2 * 2));
  Params pb = random_model_params(bart_defs, 960);
  Array bids = random_ints({2, 6}, 961, 0, bart.vocab_size);
  Array bmask = ids_array({1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1}, 2, 6);
  Array bdec = random_ints({2, 4}, 962, 0, bart.vocab_size);
  check_twin("bart lora r3 (q_proj/v_proj)", pb, {bids, bmask, bdec},
             [&](const Params& q) {
               return bart_apply(bart, q, {.input_ids = bids, .attention_mask = bmask, .decoder_input_ids = bdec});
             },
             "bart_twin(lora_weights(P, 2.0, False), X[0], X[1], X[2], 2, 2, 3, 2, True, 'gelu')");
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

// --remat full: the loss through the output head recomputed in chunks equals the whole-logits
// loss (f32 round-off: the chunks' sums associate differently), gradients too, for T5's
// tied head (scaled shared embedding), its untied lm_head, and BART's tied head + bias.
TEST(Seq2SeqOracle, RematFullChunkedHeadLossEqualsTheWholeLogitsLoss) {
  PretrainedOptions po;
  po.print_report = false;
  const std::vector<std::pair<std::string, nlohmann::json>> configs = {
      {"t5 v1.0 (tied)", small_t5(false).to_json()}, {"t5 v1.1 (untied)", small_t5(true).to_json()},
      {"bart", small_bart().to_json()}};
  for (const auto& [label, j] : configs) {
    PretrainedModel m = model_from_checkpoint(j, random_model_params(model_spec(j.at("model_type")).param_defs(
                                                                          model_spec(j.at("model_type")).parse_config(j, po)),
                                                                      610, 0.2),
                                              "memory", po);
    Array ids = random_ints({2, 7}, 611, 2, 40), dec = random_ints({2, 5}, 612, 2, 40);
    Array mask = ids_array({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, 2, 7);
    Array labels = ids_array({3, 4, 5, 6, 7, 8, 9, 10, -100, -100}, 2, 5);
    const Seq2SeqInputs in{.input_ids = ids, .attention_mask = mask, .decoder_input_ids = dec};
    auto loss_with = [&](Remat r) {
      PretrainedModel rm = m;
      rm.config = m.config.with_remat(r);
      return value_and_grad([&](const Params& q) { return rm.seq2seq_loss(q, in, labels, RngKey{7, 1}, false); })(m.params);
    };
    auto [v0, g0] = loss_with(Remat::none);
    auto [v1, g1] = loss_with(Remat::full);
    EXPECT_NEAR(v0.item(), v1.item(), 1e-6 * std::abs(v0.item())) << label;
    double worst = 0, scale = 0;
    for (const auto& [path, g] : g0) {
      std::vector<float> a = g.to_floats(), b = g1[path].to_floats();
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, double(std::abs(a[i] - b[i]))), scale = std::max(scale, double(std::abs(a[i])));
    }
    EXPECT_LE(worst, 2e-6 * scale) << label << ", max |grad| " << scale;
    std::cout << "[remat] " << label << " full (chunked head) vs stored: loss " << v0.item() << " vs " << v1.item()
              << ", max |grad diff| " << worst << " of max |grad| " << scale << " over " << g0.size() << " parameters\n";
  }
}

// Token lists padded with -1 into the twin's ragged layout.
std::vector<std::vector<int64_t>> from_ragged(const OracleTensor& t) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(t.shape[0]));
  for (int64_t r = 0; r < t.shape[0]; ++r)
    for (int64_t j = 0; j < t.shape[1]; ++j)
      if (double v = t.data[size_t(r * t.shape[1] + j)]; v >= 0) rows[size_t(r)].push_back(int64_t(v));
  return rows;
}

std::string show(const std::vector<std::vector<int64_t>>& rows) {
  std::string s;
  for (const auto& r : rows) {
    s += "[";
    for (int64_t t : r) s += std::to_string(t) + " ";
    s += "] ";
  }
  return s;
}

// Generation with the cache against the twin's full recomputation, on sources of different
// lengths: greedy, and beam search with length penalty and the logit rules. `model_call` is
// the twin's logits for (src, am, dec) in Python.
void check_generation(const std::string& label, const Params& p, const Seq2SeqLm& lm0, const std::string& model_call) {
  const std::vector<std::vector<int64_t>> sources = {{5, 9, 13, 2, 7, 30, 11}, {8, 3, 21}, {17, 17, 4, 25, 6}};
  // An eos the random model actually emits: the third token of its unconstrained greedy run.
  GenerationConfig free;
  free.max_new_tokens = 6, free.ignore_model_stop_tokens = true;
  Seq2SeqLm lm = lm0;
  // Each case names its rules; the model's own defaults (BART's forced eos) are checked below.
  lm.forced_bos_token_id.reset(), lm.forced_eos_token_id.reset();
  lm.eos_token_id = generate_seq2seq(lm, sources, free).tokens[0][2];
  auto [ids, mask] = right_pad(sources, lm.pad_token_id);
  std::string names = "names = [";
  std::vector<OracleTensor> inputs;
  for (const auto& [path, value] : p) names += "'" + path + "', ", inputs.push_back(to_oracle(value));
  inputs.push_back(to_oracle(ids)), inputs.push_back(to_oracle(mask));
  auto twin = [&](const std::string& call) {
    std::string code = twin_library() + names + "]\nP = dict(zip(names, xs[:len(names)]))\n" +
                       "src, am = xs[len(names)].long(), xs[len(names) + 1].long()\n" +
                       "def logits_for(nb):\n"
                       "    def f(dec):\n"
                       "        rows = torch.arange(dec.shape[0]) // nb\n"
                       "        return (" + model_call + ")[:, -1]\n"
                       "    return f\n"
                       "with torch.no_grad():\n    out = ragged(" + call + ")\n";
    return from_ragged(TorchOracle::instance().run(code, inputs).outputs[0]);
  };
  const std::string ids_args = std::to_string(lm.decoder_start_token_id) + ", " + std::to_string(lm.eos_token_id);
  struct Case {
    std::string name;
    GenerationConfig config;
    std::string call;
  };
  std::vector<Case> cases;
  GenerationConfig greedy;
  greedy.max_new_tokens = 9;
  cases.push_back({"greedy", greedy, "greedy_seq2seq_twin(logits_for(1), 3, " + ids_args + ", 9)"});
  GenerationConfig ruled = greedy;
  ruled.min_new_tokens = 4, ruled.no_repeat_ngram_size = 2, ruled.forced_bos_token_id = 12;
  ruled.forced_eos_token_id = lm.eos_token_id;
  cases.push_back({"greedy + rules", ruled,
                   "greedy_seq2seq_twin(logits_for(1), 3, " + ids_args + ", 9, 4, 2, 12, " +
                       std::to_string(lm.eos_token_id) + ")"});
  GenerationConfig beam = greedy;
  beam.num_beams = 3, beam.length_penalty = 1.4;
  cases.push_back({"beam 3, length penalty 1.4", beam,
                   "beam_seq2seq_twin(logits_for(3), 3, 3, " + ids_args + ", 9, 1.4)"});
  GenerationConfig beam_early = beam;
  beam_early.num_beams = 4, beam_early.early_stopping = true, beam_early.length_penalty = 0.6;
  beam_early.no_repeat_ngram_size = 3, beam_early.min_new_tokens = 2;
  cases.push_back({"beam 4, early stopping, rules", beam_early,
                   "beam_seq2seq_twin(logits_for(4), 3, 4, " + ids_args + ", 9, 0.6, True, 2, 3)"});
  for (const Case& k : cases) {
    const GenerationResult mine = generate_seq2seq(lm, sources, k.config);
    const auto ref = twin(k.call);
    EXPECT_EQ(mine.tokens, ref) << label << " " << k.name << ": meshtrain " << show(mine.tokens) << " twin "
                                << show(ref);
    std::cout << "[generate] " << label << " " << k.name << " (eos " << lm.eos_token_id << "): " << show(mine.tokens)
              << (mine.tokens == ref ? "== twin" : "!= twin") << "\n";
  }
}

TEST(Seq2SeqOracle, T5GenerationEqualsTheTwinsGreedyAndBeamSearch) {
  const T5Config c = small_t5(true);
  const Params p = random_model_params(t5_param_defs(c), 700, 0.5);
  check_generation("t5", p, t5_seq2seq_lm(c, p),
                   "t5_twin(P, src[rows], am[rows], dec, 2, 3, 3, 1e-6, 8, 12, True, False)");
}

TEST(Seq2SeqOracle, BartGenerationEqualsTheTwinsGreedyAndBeamSearch) {
  const BartConfig c = small_bart();
  const Params p = random_model_params(bart_param_defs(c), 800, 0.5);
  check_generation("bart", p, bart_seq2seq_lm(c, p), "bart_twin(P, src[rows], am[rows], dec, 2, 2, 3, 2, True, 'gelu')");
  // BART's config forces </s> (2) at the last step max_new_tokens allows, and <s> first when
  // forced_bos_token_id is set (bart-large-cnn).
  BartConfig forced = c;
  forced.forced_bos_token_id = 0;
  GenerationConfig g;
  g.max_new_tokens = 5;
  const GenerationResult r = generate_seq2seq(bart_seq2seq_lm(forced, p), {{5, 9, 13}, {8, 3}}, g);
  for (const auto& row : r.tokens) {
    ASSERT_FALSE(row.empty());
    EXPECT_EQ(row.front(), 0);
    EXPECT_TRUE(row.size() < 5 ? row.back() == 2 : row[4] == 2) << show({row});
  }
}

}  // namespace
}  // namespace mt::testing
