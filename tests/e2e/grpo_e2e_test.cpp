// `meshtrain grpo` end to end on the counting task (tests/support/counting_task.h): from a
// fine-tuned model that answers about half the held-out prompts, GRPO with LoRA and the
// exact-match reward raises the held-out greedy reward by at least 0.2; the first step's KL
// to the reference (the base with the adapters off) is 0; the same seed repeats a run's
// rollouts step for step and a run resumed from a checkpoint continues exactly (with
// num_iterations 2 too); a reward command that fails stops the run before any update with the
// checkpoints intact, and rows without the reward's field are errors naming file and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

class GrpoE2E : public TempDir {
 protected:
  static void SetUpTestSuite() { SharedCountingModel::set_up(); }
  static void TearDownTestSuite() { SharedCountingModel::tear_down(); }
  static fs::path sft_model() { return SharedCountingModel::sft_model(); }
  fs::path prompts(int n, uint32_t seed) {
    const fs::path path = dir_ / ("prompts" + std::to_string(seed) + ".jsonl");
    std::ofstream out(path);
    for (const Counting& c : counting(n, seed)) out << json{{"prompt", c.prompt}, {"answer", c.answer()}}.dump() << "\n";
    return path;
  }
};

TEST_F(GrpoE2E, ExactMatchRewardRaisesHeldOutReward) {
  const fs::path model = sft_model(), run = dir_ / "grpo";
  CliRun r = run_cli("grpo --model " + model.string() + " --data " + prompts(300, 10).string() +
                     " --reward exact_match:answer --num-generations 8 --max-completion-length 4 --temperature 1.0 "
                     "--lora-rank 8 --learning-rate 3e-3 --steps 300 --per-device-batch-size 4 --eval-fraction 0.2 "
                     "--output-dir " + run.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("reference: the base model with the adapters left out"), std::string::npos) << r.out;
  const double before = number_after(r.out, R"(held-out greedy reward ([0-9.]+))");
  const double after = number_after(r.out, R"(held-out greedy after: reward ([0-9.]+))");
  const std::vector<json> steps = metric_lines(run, "train");
  ASSERT_EQ(steps.size(), 300u);
  double first = 0, last = 0;
  for (size_t i = 0; i < 30; ++i) first += steps[i]["reward"].get<double>() / 30, last += steps[270 + i]["reward"].get<double>() / 30;
  std::cout << "  held-out greedy reward " << before << " -> " << after << "; sampled train reward " << first << " (steps 1-30) -> "
            << last << " (271-300); first step kl " << steps[0]["kl"] << "\n";
  EXPECT_GE(after, before + 0.2);
  EXPECT_GT(last, first);
  EXPECT_EQ(steps[0]["kl"].get<double>(), 0.0);  // adapters start at zero: the policy is the reference
  for (const char* k : {"reward", "reward_std", "rewards/exact_match", "kl", "clip_ratio", "completion_length",
                        "completions_stopped", "rollout_tokens_per_s"})
    EXPECT_TRUE(steps[0].contains(k)) << k;
  EXPECT_TRUE(fs::exists(run / "adapter/adapter_model.safetensors"));
  std::ifstream svg(run / "curves.svg");
  const std::string picture((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(picture.find("data-title=\"rewards\""), std::string::npos);
}

TEST_F(GrpoE2E, SeededRolloutsRepeatAndResumeExactly) {
  const fs::path model = sft_model();
  const std::string data = prompts(64, 11).string();
  for (int64_t iterations : {1, 2}) {
    SCOPED_TRACE(iterations);
    const std::string args = "grpo --model " + model.string() + " --data " + data +
                             " --reward exact_match:answer --num-generations 4 --max-completion-length 4 --learning-rate 1e-4 "
                             "--steps 8 --save-steps 4 --per-device-batch-size 4 --eval-fraction 0.1 --seed 5 "
                             "--num-iterations " + std::to_string(iterations) + " --output-dir ";
    const fs::path a = dir_ / ("a" + std::to_string(iterations)), b = dir_ / ("b" + std::to_string(iterations));
    ASSERT_EQ(run_cli(args + a.string()).code, 0);
    ASSERT_EQ(run_cli(args + b.string()).code, 0);
    const std::vector<json> la = metric_lines(a, "train"), lb = metric_lines(b, "train");
    ASSERT_EQ(la.size(), 8u);
    for (size_t i = 0; i < la.size(); ++i) {
      EXPECT_EQ(la[i]["reward"], lb[i]["reward"]) << "step " << i + 1;
      EXPECT_EQ(la[i]["loss"], lb[i]["loss"]) << "step " << i + 1;
    }
    const fs::path resumed = dir_ / ("resumed" + std::to_string(iterations));
    stopped_copy(a, resumed, 4, 8);
    ASSERT_EQ(run_cli(args + resumed.string() + " --resume").code, 0);
    EXPECT_EQ(train_losses(resumed), train_losses(a)) << "the resumed run trained differently";
  }
}

TEST_F(GrpoE2E, FailingRewardsStopBeforeAnyUpdateAndBadRowsAreErrors) {
  const std::string model = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2";
  const std::string data = prompts(32, 12).string();
  const fs::path run = dir_ / "run";
  const std::string args = "grpo --model " + model + " --data " + data +
                           " --num-generations 2 --max-completion-length 3 --per-device-batch-size 2 --output-dir " +
                           run.string();
  ASSERT_EQ(run_cli(args + " --reward exact_match:answer --steps 2").code, 0);
  const auto saved = train_losses(run);
  const std::string checkpoint = (run / "checkpoints" / "step_00000002").string();
  ASSERT_TRUE(fs::exists(checkpoint));
  const auto stamp = fs::last_write_time(fs::path(checkpoint) / "meta.json");
  CliRun bad = run_cli(args + " --reward-command 'echo the scorer broke >&2; exit 2' --steps 4 --resume");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("exited with status 2; its stderr:\nthe scorer broke"), std::string::npos) << bad.out;
  CliRun junk = run_cli(args + " --reward-command 'echo maybe' --steps 4 --resume");
  EXPECT_NE(junk.code, 0);
  EXPECT_NE(junk.out.find("printed 'maybe' on line 1: not a number"), std::string::npos) << junk.out;
  EXPECT_EQ(train_losses(run), saved) << "a failed run logged steps";
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "step_00000003"));
  EXPECT_EQ(fs::last_write_time(fs::path(checkpoint) / "meta.json"), stamp);

  const std::string rows = write("no_answer.jsonl", json{{"prompt", "a"}, {"answer", "1"}}.dump() + "\n" +
                                                        json{{"prompt", "b"}}.dump() + "\n");
  CliRun missing = run_cli("grpo --model " + model + " --data " + rows + " --reward exact_match:answer --output-dir " +
                           (dir_ / "missing").string());
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("no_answer.jsonl:2: no 'answer' field for the reward (fields: prompt)"), std::string::npos)
      << missing.out;
  CliRun none = run_cli("grpo --model " + model + " --data " + data + " --output-dir " + (dir_ / "none").string());
  EXPECT_NE(none.out.find("[grpo] name a reward"), std::string::npos) << none.out;
  CliRun one = run_cli("grpo --model " + model + " --data " + data + " --reward exact_match:answer --num-generations 1 "
                       "--output-dir " + (dir_ / "one").string());
  EXPECT_NE(one.out.find("[grpo] num_generations must be at least 2"), std::string::npos) << one.out;
}


TEST_F(GrpoE2E, ChatPromptsAreRenderedAndTheRewardCommandSeesThem) {
  const std::string model = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2";
  const std::string tmpl = write("chat.jinja",
                                 "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                                 "{% if add_generation_prompt %}<assistant>{% endif %}");
  std::string rows;
  for (int i = 0; i < 12; ++i)
    rows += json{{"prompt", {{{"role", "user"}, {"content", "say " + std::to_string(i)}}}}, {"answer", std::to_string(i)}}.dump() + "\n";
  // 1 when the program got the rendered prompt and the row's answer, else 0.
  const std::string scorer = write("scorer.py",
                                   "import json, sys\n"
                                   "for line in sys.stdin:\n"
                                   "    r = json.loads(line)\n"
                                   "    ok = r['prompt'].startswith('<user>say ') and r['prompt'].endswith('<assistant>') and 'answer' in r\n"
                                   "    print(1 if ok else 0)\n");
  const fs::path run = dir_ / "chat";
  CliRun r = run_cli("grpo --model " + model + " --data " + write("chat.jsonl", rows) + " --chat-template " + tmpl +
                     " --reward-command '/usr/bin/python3 " + scorer + "' --num-generations 2 --max-completion-length 3 "
                     "--per-device-batch-size 2 --steps 2 --output-dir " + run.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("eval prompts (conversations)"), std::string::npos) << r.out;
  const std::vector<json> steps = metric_lines(run, "train");
  ASSERT_EQ(steps.size(), 2u);
  for (const json& s : steps) EXPECT_EQ(s["rewards/command"].get<double>(), 1.0);
}


// Two processes (data=2): rank 0 samples and scores, both train on their halves; the losses
// equal one process's, and a failing reward command ends both ranks with its message.
TEST_F(GrpoE2E, TwoProcessesEqualOneAndFailTogether) {
  const std::string model = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2";
  // A reward that varies between samples (the completion's length in characters), from a program.
  const std::string scorer = write("length.py", "import json, sys\nfor l in sys.stdin: print(len(json.loads(l)['completion']))\n");
  const std::string args = "grpo --model " + model + " --data " + prompts(40, 13).string() +
                           " --reward-command '/usr/bin/python3 " + scorer + "' --num-generations 4 --max-completion-length 4 "
                           "--steps 3 --learning-rate 1e-3 --seed 2 --output-dir ";
  CliRun one = run_cli(args + (dir_ / "np1").string() + " --per-device-batch-size 4");
  ASSERT_EQ(one.code, 0) << one.out;
  CliRun two = run_cli_mpi(2, args + (dir_ / "np2").string() + " --per-device-batch-size 2");
  ASSERT_EQ(two.code, 0) << two.out;
  const auto a = train_losses(dir_ / "np1"), b = train_losses(dir_ / "np2");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  double diff = 0;
  for (const auto& [step, loss] : a) diff = std::max(diff, std::abs(loss - b.at(step)));
  const std::vector<json> la = metric_lines(dir_ / "np1", "train"), lb = metric_lines(dir_ / "np2", "train");
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i]["reward"], lb[i]["reward"]) << "step " << i + 1;
  std::cout << "  grpo on 2 processes vs 1: max |loss diff| over 3 steps " << diff << " (losses " << a.at(1) << ", "
            << a.at(2) << ", " << a.at(3) << "; rewards " << la[0]["reward"] << ", " << la[1]["reward"] << ", " << la[2]["reward"]
            << ")\n";
  EXPECT_NE(a.at(2), 0.0);  // the comparison has something to compare
  EXPECT_LT(diff, 1e-5);
  CliRun bad = run_cli_mpi(2, "grpo --model " + model + " --data " + prompts(40, 13).string() +
                                  " --reward-command 'echo broken >&2; exit 4' --num-generations 2 --per-device-batch-size 2 "
                                  "--steps 2 --output-dir " + (dir_ / "bad").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("exited with status 4; its stderr:\nbroken"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace mt::testing
