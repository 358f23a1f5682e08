// `meshtrain finetune` end to end: a small GPT-2 pretrained on the default corpus, then LoRA
// rank 8 on an instruction set generated here ("<word><n> counts to 4" -> "5", the loss on
// the responses only): the held-out loss falls by at least half, the merged export answers
// held-out prompts the base cannot, the PEFT adapter on the base generates what the merged
// model does; bad rows, targets and ranks are clear errors that write nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

const std::string kShakespeare = std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt";

struct Row {
  std::string prompt, response;
};

// "<word><n> counts to <d>" -> "<d + 1>": the filler makes every prompt new, the answer
// depends on the last digit only.
std::vector<Row> counting_rows(int n, uint32_t seed) {
  static const char* words[] = {"apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "pixel", "ember", "lunar",
                                "frost", "cedar", "amber", "delta", "sigma", "noble", "quiet", "rapid", "solar", "vivid"};
  std::mt19937 rng(seed);
  std::vector<Row> rows;
  for (int i = 0; i < n; ++i) {
    const int d = int(rng() % 9);
    const std::string w = std::string(words[rng() % 20]) + std::to_string(rng() % 100);
    rows.push_back({w + " counts to " + std::to_string(d), std::to_string(d + 1)});
  }
  return rows;
}

void write_jsonl(const fs::path& path, const std::vector<Row>& rows) {
  std::ofstream out(path);
  for (const Row& r : rows) out << nlohmann::json{{"instruction", r.prompt}, {"output", r.response}}.dump() << "\n";
}

double number_after(const std::string& text, const std::string& pattern) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(text, m, std::regex(pattern))) << pattern << " not in:\n" << text;
  return m.empty() ? -1 : std::stod(m[1].str());
}

class FinetuneE2E : public TempDir {};

TEST_F(FinetuneE2E, LoraOnInstructionsHalvesHeldOutLossAndAnswersHeldOutPrompts) {
  const fs::path base = dir_ / "base", run = dir_ / "lora", data = dir_ / "count.jsonl";
  // The default corpus (fortunes): a base with some sense of short lines, not yet of counting.
  CliRun pre = run_cli("pretrain --model gpt2 --seq-len 64 --steps 150 --output-dir " + base.string());
  ASSERT_EQ(pre.code, 0) << pre.out;
  write_jsonl(data, counting_rows(600, 7));
  const std::string ft = "finetune --model " + (base / "model").string() + " --data " + data.string() +
                         " --prompt-field instruction --response-field output --seq-len 32 --lora-rank 8 "
                         "--learning-rate 3e-3 --epochs 8 --merge-lora --output-dir " + run.string();
  CliRun r = run_cli(ft);
  ASSERT_EQ(r.code, 0) << r.out;
  std::cout << r.out.substr(0, r.out.find('\n')) << "\n";
  const double before = number_after(r.out, R"(eval loss before fine-tuning ([0-9.]+))");
  const double drop = number_after(r.out, R"(eval loss [0-9.]+ -> [0-9.]+ \(([0-9.]+) % lower\))");
  const double right_before = number_after(r.out, R"(held-out answers before: (\d+)/)");
  const double right_after = number_after(r.out, R"(held-out answers after: (\d+)/)");
  std::cout << "  held-out response loss " << before << ", " << drop << " % lower after LoRA; exact answers "
            << right_before << " -> " << right_after << " of 32\n";
  EXPECT_GE(drop, 50.0);
  EXPECT_GT(right_after, right_before);
  // LoRA trains only the adapters: the intro says how many parameters that is.
  EXPECT_NE(r.out.find("LoRA rank 8"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(run / "adapter/adapter_config.json"));
  ASSERT_TRUE(fs::exists(run / "adapter/adapter_model.safetensors"));
  ASSERT_TRUE(fs::exists(run / "model/config.json"));

  // Held-out prompts (a new seed): the merged export answers more of them than the base, and
  // base + adapter generates exactly what the merged model does.
  int merged_right = 0, base_right = 0;
  for (const Row& row : counting_rows(6, 99)) {
    const std::string gen = " --prompt \"" + row.prompt + "\" --max-new-tokens 4";
    CliRun merged = run_cli("generate --model " + (run / "model").string() + gen);
    CliRun plain = run_cli("generate --model " + (base / "model").string() + gen);
    CliRun adapter = run_cli("generate --model " + (base / "model").string() + " --adapter " + (run / "adapter").string() + gen);
    ASSERT_EQ(merged.code, 0) << merged.out;
    ASSERT_EQ(adapter.code, 0) << adapter.out;
    EXPECT_EQ(adapter.std_out, merged.std_out) << row.prompt;
    merged_right += merged.std_out == row.prompt + row.response + "\n";
    base_right += plain.std_out == row.prompt + row.response + "\n";
    std::cout << "  " << row.prompt << " -> merged " << merged.std_out.substr(row.prompt.size()) ;
  }
  std::cout << "  held-out prompts answered: merged " << merged_right << "/6, base " << base_right << "/6\n";
  EXPECT_GT(merged_right, base_right);

  // pretrain --init-from continues the base (its tokenizer, its weights: the first loss is
  // the base's last, not a fresh model's), prints a sample before the first step, and with
  // LoRA flags writes an adapter for that base.
  const fs::path cont = dir_ / "continued";
  CliRun c = run_cli("pretrain --init-from " + (base / "model").string() +
                     " --seq-len 64 --steps 10 --sample-every 5 --sample-tokens 16 --lora-rank 4 --output-dir " +
                     cont.string());
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("--- sample at step 0 ---"), std::string::npos) << c.out;
  auto train_losses = [](const fs::path& metrics) {
    std::vector<double> losses;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("split", "") == "train") losses.push_back(j["loss"].get<double>());
    }
    return losses;
  };
  const std::vector<double> base_losses = train_losses(base / "metrics.jsonl"), cont_losses = train_losses(cont / "metrics.jsonl");
  ASSERT_FALSE(base_losses.empty());
  ASSERT_FALSE(cont_losses.empty());
  std::cout << "  pretrain --init-from: first loss " << cont_losses.front() << " (base: first " << base_losses.front()
            << ", last " << base_losses.back() << ")\n";
  EXPECT_NEAR(cont_losses.front(), base_losses.back(), 0.6);
  EXPECT_LT(cont_losses.front(), base_losses.front() - 1.0);
  std::ifstream samples(cont / "samples.txt");
  std::string first_line;
  std::getline(samples, first_line);
  EXPECT_EQ(first_line, "=== step 0");
  nlohmann::json adapter = nlohmann::json::parse(std::ifstream(cont / "adapter/adapter_config.json"));
  EXPECT_EQ(adapter["base_model_name_or_path"], (base / "model").string());
  EXPECT_EQ(adapter["r"], 4);
}

// Small data works with the defaults: 64 rows hold out 6, fewer than a global batch of 8, and
// every one of them is evaluated (the run used to stop: "fewer than one global batch").
TEST_F(FinetuneE2E, SixtyFourRowsTrainWithTheDefaults) {
  write_jsonl(dir_ / "small.jsonl", counting_rows(64, 7));
  CliRun r = run_cli("finetune --model " + std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2 --data " +
                     (dir_ / "small.jsonl").string() +
                     " --prompt-field instruction --response-field output --lora-rank 2 --steps 3 --output-dir " +
                     (dir_ / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("58 train / 6 eval rows"), std::string::npos) << r.out;
  EXPECT_GT(number_after(r.out, "eval loss before fine-tuning ([0-9.]+)"), 0.0);
  EXPECT_NE(r.out.find("held-out answers after: "), std::string::npos) << r.out;
}

// By default each batch is cut after its last target token (rows of ~8 tokens, --seq-len 64):
// the held-out loss before training (no dropout) equals the one of batches --seq-len long, and
// on two data ranks, whose slices are cut to different lengths and padded to the longer
// before each step (train/batch_shapes.h), it is the same again and training runs.
TEST_F(FinetuneE2E, BatchesCutAfterTheirLastTargetScoreAsFullLengthOnes) {
  write_jsonl(dir_ / "rows.jsonl", counting_rows(96, 11));
  const std::string common = "finetune --model " + std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2 --data " +
                             (dir_ / "rows.jsonl").string() +
                             " --prompt-field instruction --response-field output --seq-len 64 --steps 3 --check-rows 0"
                             " --per-device-batch-size 4 --output-dir ";
  CliRun fixed = run_cli(common + (dir_ / "fixed").string() + " --pad-to-max-length");
  CliRun cut = run_cli(common + (dir_ / "cut").string());
  CliRun dp = run_cli_mpi(2, common + (dir_ / "dp").string() + " --mesh data=2");
  ASSERT_EQ(fixed.code, 0) << fixed.out;
  ASSERT_EQ(cut.code, 0) << cut.out;
  ASSERT_EQ(dp.code, 0) << dp.out;
  const double want = number_after(fixed.out, "eval loss before fine-tuning ([0-9.]+)");
  for (const CliRun* r : {&cut, &dp}) {
    const double got = number_after(r->out, "eval loss before fine-tuning ([0-9.]+)");
    std::cout << "  eval loss before: " << got << " (batches --seq-len long: " << want << ")\n";
    EXPECT_NEAR(got, want, 1e-5 * want);
  }
  // The rate of cut batches is in sequences; of full-length ones in tokens.
  EXPECT_NE(fixed.out.find(" tokens/s"), std::string::npos) << fixed.out;
  EXPECT_NE(cut.out.find(" examples/s"), std::string::npos) << cut.out;
}

TEST_F(FinetuneE2E, BadRowsTargetsAndRanksFailBeforeWritingAnything) {
  const fs::path base = dir_ / "base";
  CliRun pre = run_cli("pretrain --model llama --data " + kShakespeare + " --seq-len 32 --steps 2 --eval-fraction 0.005 "
                       "--output-dir " + base.string());
  ASSERT_EQ(pre.code, 0) << pre.out;
  const fs::path data = dir_ / "rows.jsonl";
  {
    std::ofstream out(data);
    out << R"({"instruction": "a", "output": "b"})" << "\n" << R"({"instruction": "c", "answer": "d"})" << "\n";
  }
  const std::string model = " --model " + (base / "model").string();
  auto expect_error = [&](const std::string& args, const std::string& needle) {
    const fs::path out = dir_ / "out";
    CliRun r = run_cli("finetune" + model + " --output-dir " + out.string() + " " + args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.out.find(needle), std::string::npos) << "'" << needle << "' not in:\n" << r.out;
    EXPECT_FALSE(fs::exists(out / "adapter")) << args;
    EXPECT_FALSE(fs::exists(out / "model")) << args;
    EXPECT_FALSE(fs::exists(out / "checkpoints")) << args;
  };
  // A row without the named field: the file and its line.
  expect_error("--data " + data.string() + " --prompt-field instruction --response-field output",
               data.string() + ":2");
  write_jsonl(dir_ / "ok.jsonl", counting_rows(40, 1));
  const std::string ok = "--data " + (dir_ / "ok.jsonl").string() + " --prompt-field instruction --response-field output ";
  expect_error(ok + "--lora-rank 4 --lora-targets c_attn", "matches no dense layer");
  expect_error(ok + "--lora-rank 1000", "rank 1000 exceeds");
  expect_error(ok + "--template \"{prompt}\"", "--template must contain {response}");
  // An adapter for another base is refused by generate too.
  CliRun g = run_cli("generate" + model + " --adapter " + (dir_ / "missing").string() + " --prompt x");
  EXPECT_NE(g.code, 0);
}

}  // namespace
}  // namespace mt::testing
