// `meshtrain glue` end to end with a small BERT trained from scratch: RTE (sentence pairs,
// entailment / not_entailment) and STS-B (regression, MSE) run train + eval and write
// metrics, TensorBoard events, eval_results.json and a best checkpoint that `eval` scores
// the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

const std::string kGlue = std::string(MT_DATA_DIR) + "/glue";
const std::string kVocab = std::string(MT_DATA_DIR) + "/tokenizers/bert-base-uncased-vocab.txt";

// The "epoch N | ..." lines of a run's output.
std::vector<std::string> epoch_lines(const std::string& out) {
  std::vector<std::string> lines;
  for (size_t p = out.find("epoch "); p != std::string::npos; p = out.find("epoch ", p + 1))
    if (p == 0 || out[p - 1] == '\n') lines.push_back(out.substr(p, out.find('\n', p) - p));
  return lines;
}

// Word by word: the same names, and numbers within what another summation order can change
// (the shards' GEMMs have other shapes): losses by 2e-3, accuracy by one of `eval_rows` eval
// examples at a near tie.
void expect_close_lines(const std::vector<std::string>& got, const std::vector<std::string>& want, const char* run,
                        int eval_rows) {
  ASSERT_EQ(got.size(), want.size()) << run;
  for (size_t l = 0; l < want.size(); ++l) {
    std::istringstream g(got[l]), w(want[l]);
    std::string gw, ww, name;
    double max_err = 0;
    while (w >> ww) {
      ASSERT_TRUE(bool(g >> gw)) << run << ": '" << got[l] << "' ends before '" << want[l] << "'";
      char* end = nullptr;
      const double wv = std::strtod(ww.c_str(), &end);
      if (*end != '\0' || ww == "|") {
        EXPECT_EQ(gw, ww) << run << ": '" << got[l] << "' vs '" << want[l] << "'";
        name = ww;
        continue;
      }
      const double gv = std::strtod(gw.c_str(), nullptr);
      max_err = std::max(max_err, std::abs(gv - wv));
      EXPECT_NEAR(gv, wv, name == "accuracy" ? 1.0 / eval_rows + 1e-6 : 2e-3)
          << run << " " << name << ": '" << got[l] << "' vs '" << want[l] << "'";
    }
    EXPECT_FALSE(bool(g >> gw)) << run << ": '" << got[l] << "' is longer than '" << want[l] << "'";
    std::cout << "  [max err] " << run << " epoch line " << l + 1 << ": " << max_err << "\n";
  }
}

class GlueE2E : public TempDir {
 protected:
  nlohmann::json run_task(const std::string& task, const std::string& extra) {
    out_ = dir_ / task;
    CliRun r = run_cli("glue --task " + task + " --config small --tokenizer " + kVocab + " --data-dir " + kGlue +
                       " --max-seq-length 64 --per-device-train-batch-size 16 --max-train-samples 320"
                       " --max-eval-samples 96 --num-train-epochs 2 --output-dir " + out_.string() + " " + extra);
    EXPECT_EQ(r.code, 0);
    output_ = r.out;
    EXPECT_NE(r.out.find("epoch 1 | train loss"), std::string::npos);
    EXPECT_NE(r.out.find("epoch 2 | train loss"), std::string::npos);
    EXPECT_TRUE(fs::exists(out_ / "metrics.jsonl"));
    EXPECT_FALSE(fs::is_empty(out_ / "tensorboard"));
    EXPECT_TRUE(fs::exists(out_ / "checkpoints" / "best" / "meta.json"));
    std::ifstream in(out_ / "eval_results.json");
    return nlohmann::json::parse(in);
  }
  // The mean train loss of each epoch line, in order.
  std::vector<double> epoch_losses() const {
    std::vector<double> out;
    for (size_t p = output_.find("| train loss "); p != std::string::npos; p = output_.find("| train loss ", p + 1))
      out.push_back(std::stod(output_.substr(p + 13)));
    return out;
  }
  fs::path out_;
  std::string output_;
};

TEST_F(GlueE2E, RteTrainsEvaluatesAndKeepsTheBestCheckpoint) {
  nlohmann::json r = run_task("rte", "--learning-rate 1e-3");
  ASSERT_TRUE(r.contains("eval_accuracy"));
  const double acc = r["eval_accuracy"].get<double>();
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 1.0);
  EXPECT_EQ(r["best"]["metric"], "accuracy");
  EXPECT_GE(r["best"]["value"].get<double>(), acc);
  // `eval` on the best checkpoint reproduces the best accuracy on the same rows.
  CliRun e = run_cli("eval --model " + (out_ / "checkpoints" / "best").string() + " --task rte --data-dir " + kGlue +
                     " --max-seq-length 64 --max-eval-samples 96");
  ASSERT_EQ(e.code, 0);
  nlohmann::json j = nlohmann::json::parse(e.std_out.substr(e.std_out.find('{')));
  EXPECT_EQ(j["examples"].get<int64_t>(), 96);
  EXPECT_EQ(j["eval_accuracy"].get<double>(), r["best"]["value"].get<double>());
  // The run evaluated 64-long rows; eval cuts each batch to its longest row by default, and
  // --pad_to_max_length keeps them whole: the same accuracy either way.
  CliRun whole = run_cli("eval --model " + (out_ / "checkpoints" / "best").string() + " --task rte --data-dir " + kGlue +
                         " --max-seq-length 64 --max-eval-samples 96 --pad_to_max_length");
  ASSERT_EQ(whole.code, 0) << whole.out;
  nlohmann::json w = nlohmann::json::parse(whole.std_out.substr(whole.std_out.find('{')));
  EXPECT_EQ(w["eval_accuracy"].get<double>(), j["eval_accuracy"].get<double>());
}

TEST_F(GlueE2E, StsbRegressionLossFalls) {
  nlohmann::json r = run_task("stsb", "--learning-rate 1e-3");
  ASSERT_TRUE(r.contains("eval_pearson"));
  ASSERT_TRUE(r.contains("eval_spearmanr"));
  EXPECT_TRUE(std::isfinite(r["eval_pearson"].get<double>()));
  EXPECT_EQ(r["best"]["metric"], "pearson");
  std::vector<double> losses = epoch_losses();
  ASSERT_EQ(losses.size(), 2u);
  std::cout << "  epoch mean MSE " << losses[0] << " -> " << losses[1] << "\n";
  EXPECT_LT(losses[1], losses[0]);
}

// A pretrained checkpoint (an HF BertLMHeadModel) fine-tunes as a classifier: the MLM head
// is reported unused and the pooler and classifier newly initialized, as HF reports them.
TEST_F(GlueE2E, MrpcFromAPretrainedDirectory) {
  const std::string out = (dir_ / "mrpc").string();
  // Spelled as for HF's run_flax_glue.py (underscore aliases).
  CliRun r = run_cli("glue --task_name mrpc --model_name_or_path " + std::string(MT_DATA_DIR) + "/models/hf-tiny-bert --data-dir " +
                     kGlue + " --max-train-samples 64 --max-eval-samples 32 --num_train_epochs 1 --max_seq_length 128 "
                     "--per_device_train_batch_size 8 --per_device_eval_batch_size 8 --learning_rate 5e-5 --weight_decay 0.0 "
                     "--warmup_steps 0 --eval_steps 0 --seed 42 --output_dir " + out);
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("were not used when initializing BertForSequenceClassification: [cls.predictions.bias"),
            std::string::npos);
  EXPECT_NE(r.out.find("newly initialized: [bert.pooler.dense.weight, bert.pooler.dense.bias, classifier.weight, "
                       "classifier.bias]"),
            std::string::npos);
  std::ifstream in(fs::path(out) / "eval_results.json");
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_TRUE(j.contains("eval_f1") && j.contains("eval_accuracy"));
  EXPECT_TRUE(fs::exists(fs::path(out) / "model" / "vocab.txt"));  // the model directory carries its tokenizer
}

// The same fine-tuning on 2 processes with the weights split over model=2, and on 2 data
// ranks: the per-epoch losses and metrics equal the single process's.
TEST_F(GlueE2E, RteOnTwoProcessesMatchesOne) {
  const std::string common = "glue --task rte --config small --tokenizer " + kVocab + " --data-dir " + kGlue +
                             " --max-seq-length 32 --max-train-samples 64 --max-eval-samples 32 --num-train-epochs 2"
                             " --learning-rate 1e-3 --per-device-eval-batch-size 4 ";
  CliRun one = run_cli(common + "--per-device-train-batch-size 8 --output-dir " + (dir_ / "one").string());
  CliRun tp = run_cli_mpi(2, common + "--per-device-train-batch-size 8 --model-shards 2 --output-dir " + (dir_ / "tp").string());
  CliRun dp = run_cli_mpi(2, common + "--per-device-train-batch-size 4 --mesh data=2 --output-dir " + (dir_ / "dp").string());
  ASSERT_EQ(one.code, 0);
  ASSERT_EQ(tp.code, 0);
  ASSERT_EQ(dp.code, 0);
  std::vector<std::string> a = epoch_lines(one.out);
  ASSERT_EQ(a.size(), 2u);
  expect_close_lines(epoch_lines(tp.out), a, "model=2 vs 1 process", 32);
  expect_close_lines(epoch_lines(dp.out), a, "data=2 vs 1 process", 32);
}

// --pad_to_max_length false: each batch cut to its longest row (SST-2's sentences are short)
// gives the fixed-length run's losses and accuracy, on one process and on two data ranks,
// whose slices come out of different lengths and are padded to the longer before each step.
// Dropout is off: its masks are drawn over flat positions, which a shorter batch renumbers.
TEST_F(GlueE2E, Sst2PaddedToEachBatchsLongestRowMatchesFixedLength) {
  const fs::path config = dir_ / "no_dropout.json";
  std::ofstream(config) << R"({"vocab_size": 30522, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 128, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})";
  const std::string common = "glue --task sst2 --config " + config.string() + " --tokenizer " + kVocab + " --data-dir " +
                             kGlue + " --max-seq-length 128 --max-train-samples 320 --max-eval-samples 64 "
                             "--num-train-epochs 2 --learning-rate 1e-3 --per-device-eval-batch-size 4 ";
  CliRun fixed = run_cli(common + "--per-device-train-batch-size 16 --output-dir " + (dir_ / "fixed").string());
  CliRun cut = run_cli(common + "--per-device-train-batch-size 16 --pad_to_max_length false --output-dir " +
                       (dir_ / "cut").string());
  CliRun dp = run_cli_mpi(2, common + "--per-device-train-batch-size 8 --mesh data=2 --pad-to-max-length false "
                                      "--pad-to-multiple-of 16 --output-dir " + (dir_ / "dp").string());
  ASSERT_EQ(fixed.code, 0) << fixed.out;
  ASSERT_EQ(cut.code, 0) << cut.out;
  ASSERT_EQ(dp.code, 0) << dp.out;
  const std::vector<std::string> a = epoch_lines(fixed.out);
  ASSERT_EQ(a.size(), 2u);
  expect_close_lines(epoch_lines(cut.out), a, "cut to the longest row vs 128", 64);
  expect_close_lines(epoch_lines(dp.out), a, "cut, data=2 vs 128 on 1 process", 64);
  // The batches were shorter: the run says how long they were on average.
  for (const CliRun* r : {&cut, &dp}) {
    const size_t p = r->out.find("glue: train batches padded to their longest row (a multiple of ");
    ASSERT_NE(p, std::string::npos) << r->out;
    const size_t colon = r->out.find("): ", p);
    const double mean = std::stod(r->out.substr(colon + 3));
    std::cout << "  mean positions per row " << mean << " of 128\n";
    EXPECT_GT(mean, 8.0);
    EXPECT_LT(mean, 80.0);
  }
  EXPECT_EQ(fixed.out.find("glue: train batches padded"), std::string::npos);
}

}  // namespace
}  // namespace mt::testing
