// Encoder-decoder generation: the cached decoder (self-attention keys/values appended per
// step, cross-attention keys/values projected once and reordered with the beams) gives the
// same tokens and logits as recomputing the whole target at every step; the logit rules;
// input errors.
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/models/bart.h"
#include "meshtrain/models/decoding.h"
#include "meshtrain/models/seq2seq_generate.h"
#include "meshtrain/models/t5.h"
#include "meshtrain/train/seq2seq_task.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "tests/support/model_twins.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using namespace mt::models;

Seq2SeqLm small_model(bool t5, Params& keep) {
  if (t5) {
    T5Config c;
    c.vocab_size = 50, c.d_model = 16, c.d_kv = 4, c.d_ff = 20, c.num_layers = 2, c.num_decoder_layers = 2;
    c.num_heads = 4, c.relative_attention_num_buckets = 8, c.relative_attention_max_distance = 10;
    keep = random_model_params(t5_param_defs(c), 11, 0.4);
    return t5_seq2seq_lm(c, keep);
  }
  BartConfig c;
  c.vocab_size = 50, c.max_position_embeddings = 24, c.d_model = 16, c.encoder_layers = 2, c.decoder_layers = 2;
  c.encoder_ffn_dim = c.decoder_ffn_dim = 20, c.encoder_attention_heads = c.decoder_attention_heads = 4;
  c.forced_eos_token_id.reset();
  keep = random_model_params(bart_param_defs(c), 12, 0.4);
  return bart_seq2seq_lm(c, keep);
}

TEST(Seq2SeqGenerate, CacheEqualsRecomputationForGreedyAndBeamSearch) {
  const std::vector<std::vector<int64_t>> sources = {{4, 8, 15, 16, 23, 42}, {7, 9}, {30, 31, 32, 33}};
  for (bool t5 : {true, false}) {
    Params p;
    const Seq2SeqLm lm = small_model(t5, p);
    for (int64_t beams : {1, 3}) {
      GenerationConfig c;
      c.max_new_tokens = 10, c.num_beams = beams, c.return_logits = true, c.ignore_model_stop_tokens = true;
      GenerationConfig plain = c;
      plain.use_cache = false;
      const GenerationResult cached = generate_seq2seq(lm, sources, c), full = generate_seq2seq(lm, sources, plain);
      const std::string label = std::string(t5 ? "t5" : "bart") + " beams " + std::to_string(beams);
      EXPECT_EQ(cached.tokens, full.tokens) << label;
      ASSERT_EQ(cached.step_logits.size(), full.step_logits.size());
      double worst = 0;
      for (size_t i = 0; i < cached.step_logits.size(); ++i)
        worst = std::max(worst, expect_close(cached.step_logits[i], full.step_logits[i], {2e-5, 2e-5}, label));
      std::cout << "[cache] " << label << ": " << cached.step_logits.size() << " steps, max |logits diff| " << worst
                << "\n";
      for (const auto& row : cached.tokens) EXPECT_EQ(row.size(), 10u) << label;
    }
  }
}

TEST(Seq2SeqGenerate, LogitRules) {
  const float ban = -std::numeric_limits<float>::infinity();
  GenerationConfig c;
  c.max_new_tokens = 5, c.min_new_tokens = 2, c.no_repeat_ngram_size = 2;
  std::vector<float> s(8, 0.5f);
  // Sequence 0 3 4 3: the bigram (3, 4) exists, so after the last 3, token 4 is banned; the
  // stop token 1 is banned before two new tokens.
  apply_logit_rules(s, {0, 3, 4, 3}, 1, c, {1});
  EXPECT_EQ(s, (std::vector<float>{0.5f, ban, 0.5f, 0.5f, ban, 0.5f, 0.5f, 0.5f}));
  s.assign(8, 0.5f);
  apply_logit_rules(s, {0, 3, 4, 3}, 2, c, {1});
  EXPECT_EQ(s[1], 0.5f);
  c.forced_bos_token_id = 6, c.forced_eos_token_id = 1;
  s.assign(8, 0.5f);
  apply_logit_rules(s, {0}, 0, c, {1});
  EXPECT_EQ(s, (std::vector<float>{ban, ban, ban, ban, ban, ban, 0.f, ban}));
  s.assign(8, 0.5f);
  apply_logit_rules(s, {0, 6, 2, 5, 7}, 4, c, {1});  // the last step max_new_tokens allows
  EXPECT_EQ(s, (std::vector<float>{ban, 0.f, ban, ban, ban, ban, ban, ban}));
}

TEST(Seq2SeqGenerate, BadInputsAreClearErrors) {
  Params p;
  const Seq2SeqLm bart = small_model(false, p);
  GenerationConfig c;
  c.num_beams = 0;
  expect_error([&] { generate_seq2seq(bart, {{4, 5}}, c); }, {"num_beams must be >= 1, got 0"});
  expect_error([&] { generate_seq2seq(bart, {{4, 5}, {}}); }, {"source 1 is empty"});
  expect_error([&] { generate_seq2seq(bart, {{4, 50}}); }, {"source 0 has token 50 outside the vocabulary of 50"});
  expect_error([&] { generate_seq2seq(bart, {std::vector<int64_t>(25, 3)}); },
               {"a source of 25 tokens exceeds the model's maximum of 24 positions"});
  c = {};
  c.forced_bos_token_id = 99;
  expect_error([&] { generate_seq2seq(bart, {{4}}, c); }, {"forced_bos_token_id 99 is outside the vocabulary of 50"});
  // The learned positions bound the target: 24 positions leave 23 new tokens after the start.
  c = {};
  c.max_new_tokens = 100, c.ignore_model_stop_tokens = true;
  EXPECT_EQ(generate_seq2seq(bart, {{4}}, c).tokens[0].size(), 23u);
}

}  // namespace
// Token accuracy by hand: pair 1 all 3 right; pair 2 has 1 of 2 right plus a missing token
// (its target is longer: 3); pair 3 predicts an extra token (4 counted, 2 right) -> 6 / 10.
TEST(Seq2SeqTask, TokenAccuracyCountsMissingAndExtraTokensAsWrong) {
  EXPECT_DOUBLE_EQ(train::token_accuracy({{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}, {{1, 2, 3}, {4, 0}, {7, 8, 0, 1}}), 0.6);
  EXPECT_DOUBLE_EQ(train::token_accuracy({{}}, {{}}), 1.0);
  EXPECT_DOUBLE_EQ(train::token_accuracy({{5}}, {{}}), 0.0);
  expect_error([] { train::token_accuracy({{1}}, {}); }, {"1 targets but 0 predictions"});
}

// The ids seq2seq trains on: T5's "$A </s>" template ends the text once (not twice), and a
// long text is cut to max_len with the end token kept last.
TEST(Seq2SeqTask, T5SourcesEndWithOneEndToken) {
  auto tok = tokenizers::load_tokenizer(std::string(MT_DATA_DIR) + "/tokenizers/t5-spiece.model");
  EXPECT_EQ(train::seq2seq_ids(*tok, "Das Haus ist wunderbar.", 64, 1), (std::vector<int64_t>{644, 4598, 229, 19250, 5, 1}));
  EXPECT_EQ(train::seq2seq_ids(*tok, "Das Haus ist wunderbar.", 3, 1), (std::vector<int64_t>{644, 4598, 1}));
  EXPECT_EQ(train::seq2seq_ids(*tok, "<extra_id_0> Haus", 64, 1), (std::vector<int64_t>{32099, 4598, 1}));
}

}  // namespace mt::testing
