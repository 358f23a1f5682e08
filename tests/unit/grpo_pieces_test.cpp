// GRPO's pieces that need no reference: the built-in rewards and the reward command (its
// protocol, and its failures as errors), parsing of --reward, sampling by the serving engine
// (a fixed seed reproduces the completions, another seed changes them, greedy equals
// models::generate), and the prompt order that repeats each batch num_iterations times.
#include <gtest/gtest.h>

#include <set>

#include "meshtrain/models/generate.h"
#include "meshtrain/posttrain/grpo_rollout.h"
#include "meshtrain/posttrain/rewards.h"
#include "meshtrain/posttrain/sampling.h"
#include "tests/support/op_check.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

using namespace mt::posttrain;

std::vector<double> score(const RewardFunction& f, const std::vector<std::string>& completions, const data::Example& row) {
  std::vector<RewardInput> in;
  for (const std::string& c : completions) in.push_back({"q", c, &row});
  return f.score(in);
}

TEST(GrpoRewards, BuiltInsReadTheRowsFields) {
  const data::Example row{{"answer", std::string("42")}, {"total", 1234.5}};
  EXPECT_EQ(score(exact_match_reward("answer"), {"42", " 42 \nbecause", "41", "420"}, row),
            (std::vector<double>{1, 1, 0, 0}));
  EXPECT_EQ(score(numeric_reward("total"), {"so 1,234.5", "1234.50", "1234", "none"}, row), (std::vector<double>{1, 1, 0, 0}));
  EXPECT_EQ(score(format_reward(R"(\d+)"), {"42", "42 ", "x"}, row), (std::vector<double>{1, 0, 0}));
  // A regex may hold commas: they split rewards only before a known kind.
  const std::vector<RewardFunction> parsed = parse_rewards(R"(exact_match:answer,format:\d{1,3},numeric:total)");
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[1].name, "format");
  EXPECT_EQ(score(parsed[1], {"123", "1234"}, row), (std::vector<double>{1, 0}));
  EXPECT_EQ(reward_fields("exact_match:answer,format:a,numeric:total"), (std::vector<std::string>{"answer", "total"}));
  expect_error([] { parse_rewards("bleu:answer"); }, {"[grpo] unknown reward 'bleu'"});
  expect_error([] { parse_rewards("format:("); }, {"[grpo] format:( is not a valid regex"});
  expect_error([] { parse_rewards("exact_match"); }, {"needs its argument"});
}

class GrpoCommand : public TempDir {};

TEST_F(GrpoCommand, RewardCommandReadsJsonLinesAndItsFailuresAreErrors) {
  const data::Example row{{"answer", std::string("7")}};
  // The program sees the prompt, the completion and the row's fields.
  const std::string script = write("score.py",
                                   "import json, sys\n"
                                   "for line in sys.stdin:\n"
                                   "    r = json.loads(line)\n"
                                   "    print(1.0 if r['completion'].strip() == r['answer'] and r['prompt'] == 'q' else 0.25)\n");
  EXPECT_EQ(score(command_reward("/usr/bin/python3 " + script), {"7", "8", " 7"}, row), (std::vector<double>{1, 0.25, 1}));
  expect_error([&] { score(command_reward("echo oops >&2; exit 3"), {"a"}, row); },
               {"[grpo] the reward command 'echo oops >&2; exit 3' exited with status 3", "its stderr:\noops"});
  expect_error([&] { score(command_reward("echo 1; echo high"), {"a", "b"}, row); },
               {"printed 'high' on line 2: not a number"});
  expect_error([&] { score(command_reward("echo 1"), {"a", "b"}, row); }, {"printed 1 numbers for 2 completions"});
}

std::shared_ptr<models::PretrainedModel> tiny_gpt2() {
  nlohmann::json c = models::model_spec("gpt2").small_config(64, 32, 0);
  c["n_layer"] = 1, c["n_embd"] = 16, c["n_head"] = 2;
  models::PretrainedOptions po;
  po.init_key = RngKey{3, 0};
  return std::make_shared<models::PretrainedModel>(models::init_model(c, po));
}

TEST(GrpoSampling, SeededSamplesRepeatAndGreedyEqualsGenerate) {
  auto m = tiny_gpt2();
  const std::vector<std::vector<int64_t>> prompts{{5, 6, 7}, {9}, {1, 2}};
  SamplingOptions o;
  o.n = 4, o.max_new_tokens = 6, o.temperature = 1.0, o.seed = 11, o.stop_tokens = {0};
  const SampledCompletions a = sample_completions(*m, m->params, prompts, o), b = sample_completions(*m, m->params, prompts, o);
  ASSERT_EQ(a.tokens.size(), 12u);
  EXPECT_EQ(a.tokens, b.tokens);
  std::set<std::vector<int64_t>> distinct(a.tokens.begin(), a.tokens.begin() + 4);
  EXPECT_GT(distinct.size(), 1u) << "a prompt's 4 samples are all alike";
  o.seed = 12;
  EXPECT_NE(sample_completions(*m, m->params, prompts, o).tokens, a.tokens);
  // Greedy: what models::generate gives each prompt.
  o.temperature = 0, o.n = 1;
  const SampledCompletions g = sample_completions(*m, m->params, prompts, o);
  for (size_t p = 0; p < prompts.size(); ++p) {
    models::GenerationConfig gc;
    gc.max_new_tokens = 6;
    gc.stop_tokens = {0};
    const models::GenerationResult r = models::generate(m->causal_lm(), {prompts[p]}, gc);
    std::vector<int64_t> want = r.tokens[0];
    EXPECT_EQ(g.tokens[p], want) << "prompt " << p;
  }
}

TEST(GrpoData, PromptOrderRepeatsEachBatchInARow) {
  std::vector<data::Example> ex;
  for (int64_t i = 0; i < 7; ++i) ex.push_back({{"v", i}});
  auto ordered = grpo_prompt_order(data::make_dataset(ex), 3, 2, 5);
  ASSERT_EQ(ordered->size(), 12);  // two batches of 3, each twice; the 7th prompt left out
  std::set<int64_t> seen;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(ordered->get(b * 6 + i).as_int("v"), ordered->get(b * 6 + 3 + i).as_int("v"));
      seen.insert(ordered->get(b * 6 + i).as_int("v"));
    }
  EXPECT_EQ(seen.size(), 6u);
}

}  // namespace
}  // namespace mt::testing
