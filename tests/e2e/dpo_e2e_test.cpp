// `meshtrain dpo` end to end. A small GPT-2 pretrained on the default corpus, fine-tuned on
// "<word><n> counts to d" -> "d+1" rows until it answers about half of them; then DPO with
// LoRA (the reference: the base with the adapters left out) on pairs whose rejected answer is
// the copying error the model makes: the first step's loss is ln 2 with every reward 0,
// held-out rewards/accuracies pass 0.9 and the model answers more held-out prompts than the
// fine-tuned one did. Full-weight DPO with a frozen reference and with precomputed reference
// log-probabilities trains identically and resumes exactly; conversational rows are rendered
// by a chat template; bad rows are errors naming the file and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/counting_task.h"
#include "tests/support/run_metrics.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class DpoE2E : public TempDir {
 protected:
  static void SetUpTestSuite() { SharedCountingModel::set_up(); }
  static void TearDownTestSuite() { SharedCountingModel::tear_down(); }
  static fs::path sft_model() { return SharedCountingModel::sft_model(); }
  // Pairs: the right answer chosen, the prompt's own digit (the model's commonest error) rejected.
  fs::path pairs(int n, uint32_t seed) {
    const fs::path path = dir_ / ("pairs" + std::to_string(seed) + ".jsonl");
    std::ofstream out(path);
    for (const Counting& c : counting(n, seed))
      out << json{{"prompt", c.prompt}, {"chosen", c.answer()}, {"rejected", std::to_string(c.digit)}}.dump()
          << "\n";
    return path;
  }
};

TEST_F(DpoE2E, LoraDpoStartsAtLn2AndRaisesPreferenceAndExactAnswers) {
  const fs::path model = sft_model(), run = dir_ / "dpo";
  CliRun r = run_cli("dpo --model " + model.string() + " --data " + pairs(400, 8).string() +
                     " --seq-len 32 --lora-rank 8 --learning-rate 1e-3 --epochs 2 --beta 0.5 --rpo-alpha 1 --output-dir " +
                     run.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("reference: the base model with the adapters left out"), std::string::npos) << r.out;
  const std::vector<json> train = metric_lines(run, "train");
  ASSERT_EQ(train.size(), 90u);
  // The policy starts as its reference: DPO's loss ln 2 plus RPO's NLL, every reward 0.
  const double first_dpo = train[0]["loss"].get<double>() - train[0]["nll_loss"].get<double>();
  std::cout << "  first step: DPO part " << first_dpo << " (ln 2 = " << std::log(2.0) << "), rewards/chosen "
            << train[0]["rewards/chosen"] << ", rewards/rejected " << train[0]["rewards/rejected"] << "\n";
  EXPECT_NEAR(first_dpo, std::log(2.0), 1e-6);
  for (const char* k : {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"})
    EXPECT_EQ(train[0][k].get<double>(), 0.0) << k;
  const std::vector<json> evals = metric_lines(run, "eval");
  ASSERT_FALSE(evals.empty());
  const double accuracy = evals.back()["eval_rewards/accuracies"].get<double>();
  const double before = number_after(r.out, R"(held-out answers before: (\d+)/)");
  const double after = number_after(r.out, R"(held-out answers after: (\d+)/)");
  std::cout << "  held-out rewards/accuracies " << accuracy << ", margins " << evals.back()["eval_rewards/margins"]
            << "; exact answers " << before << " -> " << after << " of 32\n";
  EXPECT_GT(accuracy, 0.9);
  EXPECT_GT(after, before);
  EXPECT_TRUE(fs::exists(run / "adapter/adapter_model.safetensors"));
  std::ifstream svg(run / "curves.svg");
  const std::string picture((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(picture.find("data-title=\"rewards\""), std::string::npos);
}

TEST_F(DpoE2E, FrozenAndPrecomputedReferencesAgreeAndResumeExactly) {
  const fs::path model = sft_model(), data = pairs(64, 9);
  const std::string args = "dpo --model " + model.string() + " --data " + data.string() +
                           " --seq-len 32 --per-device-batch-size 4 --learning-rate 1e-4 --steps 8 --save-steps 4 "
                           "--eval-fraction 0.125 --output-dir ";
  CliRun frozen = run_cli(args + (dir_ / "frozen").string());
  ASSERT_EQ(frozen.code, 0) << frozen.out;
  EXPECT_NE(frozen.out.find("reference: a frozen copy of the model"), std::string::npos) << frozen.out;
  CliRun pre = run_cli(args + (dir_ / "pre").string() + " --precompute-ref");
  ASSERT_EQ(pre.code, 0) << pre.out;
  EXPECT_NE(pre.out.find("reference log-probabilities precomputed for 64 pairs"), std::string::npos) << pre.out;
  const auto a = train_losses(dir_ / "frozen"), b = train_losses(dir_ / "pre");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  EXPECT_NEAR(a.at(1), std::log(2.0), 1e-6);
  double diff = 0;
  for (const auto& [step, loss] : a) diff = std::max(diff, std::abs(loss - b.at(step)));
  std::cout << "  frozen vs precomputed reference: max |loss diff| over 8 steps " << diff << "\n";
  EXPECT_LT(diff, 1e-5);
  EXPECT_LT(a.at(8), a.at(1));
  // On two data ranks: each rank's chosen and rejected sequences are cut after their own last
  // response token, then padded to the ranks' longest (in the precomputing Predictor and in
  // the steps), so the run takes the one-process steps.
  const std::string dp_args = "dpo --model " + model.string() + " --data " + data.string() +
                              " --seq-len 32 --per-device-batch-size 2 --learning-rate 1e-4 --steps 8 --save-steps 4 "
                              "--eval-fraction 0.125 --precompute-ref --mesh data=2 --output-dir ";
  CliRun dp = run_cli_mpi(2, dp_args + (dir_ / "dp").string());
  ASSERT_EQ(dp.code, 0) << dp.out;
  const auto c = train_losses(dir_ / "dp");
  ASSERT_EQ(c.size(), 8u);
  double dp_diff = 0;
  for (const auto& [step, loss] : b) dp_diff = std::max(dp_diff, std::abs(loss - c.at(step)));
  std::cout << "  data=2 vs one process (precomputed reference): max |loss diff| over 8 steps " << dp_diff << "\n";
  EXPECT_LT(dp_diff, 1e-5);
  // Stopped after the step-4 checkpoint and resumed: the same 8 losses.
  const fs::path resumed = dir_ / "resumed";
  stopped_copy(dir_ / "frozen", resumed, 4, 8);
  ASSERT_EQ(run_cli(args + resumed.string() + " --resume").code, 0);
  EXPECT_EQ(train_losses(resumed), a) << "the resumed run trained differently";
}

TEST_F(DpoE2E, ConversationsAreRenderedByTheChatTemplate) {
  const std::string model = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2";
  const std::string tmpl = write("chat.jinja",
                                 "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                                 "{% if add_generation_prompt %}<assistant>{% endif %}");
  std::string rows;
  for (int i = 0; i < 16; ++i) {
    const json user = {{"role", "user"}, {"content", "say " + std::to_string(i)}};
    if (i % 2)  // explicit prompt
      rows += json{{"prompt", {user}}, {"chosen", {{{"role", "assistant"}, {"content", std::to_string(i)}}}},
                   {"rejected", {{{"role", "assistant"}, {"content", "no"}}}}}.dump() + "\n";
    else  // implicit: the shared opening turn
      rows += json{{"chosen", {user, {{"role", "assistant"}, {"content", std::to_string(i)}}}},
                   {"rejected", {user, {{"role", "assistant"}, {"content", "no"}}}}}.dump() + "\n";
  }
  CliRun r = run_cli("dpo --model " + model + " --data " + write("chat.jsonl", rows) + " --chat-template " + tmpl +
                     " --seq-len 24 --per-device-batch-size 2 --steps 3 --output-dir " + (dir_ / "chat").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(conversations, 0 truncated)"), std::string::npos) << r.out;
  EXPECT_NEAR(train_losses(dir_ / "chat").at(1), std::log(2.0), 1e-6);
}

TEST_F(DpoE2E, BadRowsAreClearErrors) {
  const std::string model = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2";
  auto fails = [&](const std::string& file, const std::string& extra, const std::vector<std::string>& needles) {
    CliRun r = run_cli("dpo --model " + model + " --data " + file + extra + " --steps 1 --output-dir " + (dir_ / "bad").string());
    EXPECT_NE(r.code, 0);
    for (const std::string& n : needles) EXPECT_NE(r.out.find(n), std::string::npos) << n << " not in:\n" << r.out;
    EXPECT_FALSE(fs::exists(dir_ / "bad" / "checkpoints"));
  };
  const std::string good = json{{"prompt", "a"}, {"chosen", "b"}, {"rejected", "c"}}.dump() + "\n";
  fails(write("no_rejected.jsonl", good + json{{"prompt", "a"}, {"chosen", "b"}}.dump() + "\n"), "",
        {"no_rejected.jsonl:2: no 'rejected' field (fields: chosen, prompt)"});
  fails(write("not_json.jsonl", good + "{oops\n"), "", {"not_json.jsonl:2: not a JSON object"});
  fails(write("mixed.jsonl", good + json{{"chosen", {{{"role", "user"}, {"content", "x"}}}}, {"rejected", {{{"role", "user"}, {"content", "y"}}}}}.dump() + "\n"),
        "", {"mixed.jsonl:2", "text rows and conversations mixed"});
  fails(write("ok.jsonl", good + good), " --beta 0", {"[dpo] beta must be positive, got 0"});
  fails(write("ok2.jsonl", good + good), " --loss ipo --label-smoothing 0.1", {"label smoothing applies to the sigmoid loss"});
}

}  // namespace
}  // namespace mt::testing
