// Whole commands on the GPU against the same commands on the CPU: 20 training steps of
// miniGPT, GPT-2 and LLaMA (pretrain) and a BERT classifier (glue) with --device cuda give the
// CPU's losses (f32 within 1e-4 relative, bf16 mixed precision and bf16 matmuls within 2e-2);
// greedy generation from the trained checkpoint gives the same ids; a checkpoint written on
// the GPU resumes on the CPU to the uninterrupted losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/run_metrics.h"
#include "tests/support/scoped_env.h"
#include "tests/support/gpu.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

// Max relative difference of the losses both runs logged (which must be the same steps).
double max_relative_loss_error(const fs::path& a, const fs::path& b, size_t expect_steps) {
  const auto la = train_losses(a), lb = train_losses(b);
  EXPECT_EQ(la.size(), expect_steps) << a;
  EXPECT_EQ(lb.size(), expect_steps) << b;
  double worst = 0;
  for (const auto& [step, loss] : la) {
    auto it = lb.find(step);
    if (it == lb.end()) {
      ADD_FAILURE() << "step " << step << " missing from " << b;
      continue;
    }
    worst = std::max(worst, std::abs(loss - it->second) / std::max(1e-12, std::abs(it->second)));
  }
  return worst;
}

// A GPU step after warm-up neither reads to the host nor uploads anything but its batch
// (metrics.jsonl's host_reads and host_uploads from step 2 on): what a captured graph needs.
void expect_no_host_traffic_after_warm_up(const fs::path& run) {
  int checked = 0;
  for (const nlohmann::json& j : metric_lines(run, "train")) {
    if (!j.contains("host_uploads") || j["step"].get<int64_t>() < 2) continue;
    EXPECT_EQ(j["host_reads"].get<double>(), 0.0) << run << ": " << j.dump();
    EXPECT_EQ(j["host_uploads"].get<double>(), 0.0) << run << ": " << j.dump();
    ++checked;
  }
  EXPECT_GT(checked, 0) << run << " logged no host_uploads";
}

class GpuTraining : public TempDir {
 protected:
  std::string shakespeare() const { return gpu_data_dir() + "/text/tinyshakespeare.txt"; }
  std::string pretrain(const std::string& model) const {
    return "pretrain --model " + model + " --data " + shakespeare() +
           " --seq-len 64 --eval-fraction 0.005 --sample-every 0 --per-device-batch-size 8 --steps 20 ";
  }
};

TEST_F(GpuTraining, PretrainOnTheGpuGivesTheCpuLosses) {
  MT_REQUIRE_GPU();
  for (const std::string model : {"minigpt", "gpt2", "llama"}) {
    const fs::path cpu = dir_ / (model + "_cpu"), gpu = dir_ / (model + "_gpu");
    ASSERT_EQ(run_cli(pretrain(model) + "--device cpu --output-dir " + cpu.string()).code, 0);
    CliRun g = run_cli(pretrain(model) + "--device cuda --output-dir " + gpu.string());
    ASSERT_EQ(g.code, 0);
    EXPECT_NE(g.out.find("device cuda:0"), std::string::npos);
    const double err = max_relative_loss_error(gpu, cpu, 20);
    std::cout << "  [max err] " << model << ": 20 f32 training losses, GPU vs CPU, relative: " << err << "\n";
    EXPECT_LE(err, 1e-4);
    expect_no_host_traffic_after_warm_up(gpu);
  }
}

// Mixed precision (--precision bf16: bf16 activations over f32 masters) and the older
// bf16-matmul mode train on the GPU as on the CPU, within bf16's 2e-2.
TEST_F(GpuTraining, Bf16OnTheGpuStaysCloseToTheCpu) {
  MT_REQUIRE_GPU();
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"minigpt", "bf16"}, {"gpt2", "bf16"}, {"llama", "bf16"}, {"gpt2", "bf16-matmul"}};
  for (const auto& [model, precision] : runs) {
    const fs::path cpu = dir_ / (model + precision + "_cpu"), gpu = dir_ / (model + precision + "_gpu");
    const std::string args = pretrain(model) + "--precision " + precision;
    ASSERT_EQ(run_cli(args + " --device cpu --output-dir " + cpu.string()).code, 0);
    ASSERT_EQ(run_cli(args + " --device cuda --output-dir " + gpu.string()).code, 0);
    const double err = max_relative_loss_error(gpu, cpu, 20);
    std::cout << "  [max err] " << model << ": 20 " << precision << " training losses, GPU vs CPU, relative: " << err
              << "\n";
    EXPECT_LE(err, 2e-2) << model << " " << precision;
  }
}

// --precision f16 (the bf16 policy in half, the loss scaled) on the GPU as on the CPU: 20 GPT-2
// and LLaMA steps within 1e-2 (f16 keeps 11 bits) at a fixed scale of 1024, far from
// overflowing, so that a borderline overflow on one device only cannot make the runs differ;
// no step skipped on either.
TEST_F(GpuTraining, F16WithLossScalingOnTheGpuStaysCloseToTheCpu) {
  MT_REQUIRE_GPU();
  for (const std::string model : {"gpt2", "llama"}) {
    const fs::path cpu = dir_ / (model + "_f16_cpu"), gpu = dir_ / (model + "_f16_gpu");
    const std::string args = pretrain(model) + "--precision f16 --loss-scale 1024";
    ASSERT_EQ(run_cli(args + " --device cpu --output-dir " + cpu.string()).code, 0);
    CliRun g = run_cli(args + " --device cuda --output-dir " + gpu.string());
    ASSERT_EQ(g.code, 0) << g.out;
    const double err = max_relative_loss_error(gpu, cpu, 20);
    std::cout << "  [max err] " << model << ": 20 f16 training losses, GPU vs CPU, relative: " << err << "\n";
    EXPECT_LE(err, 1e-2) << model;
    std::vector<double> cpu_scales, gpu_scales;
    for (const nlohmann::json& j : metric_lines(cpu, "train")) cpu_scales.push_back(j.value("loss_scale", 0.0));
    for (const nlohmann::json& j : metric_lines(gpu, "train")) gpu_scales.push_back(j.value("loss_scale", 0.0));
    EXPECT_EQ(gpu_scales, std::vector<double>(20, 1024.0)) << model;
    EXPECT_EQ(cpu_scales, gpu_scales) << model;
    EXPECT_NE(g.out.find("(0 steps skipped on overflow)"), std::string::npos) << g.out;
  }
}

// LLaMA (no dropout anywhere) with its attention on cuDNN's fused engine (MT_ATTENTION_CUDNN=1;
// the small config's 4 query heads over 2 key/value heads: grouped heads both ways): 20 bf16
// steps on the GPU within bf16's 2e-2 of the CPU's, and the route said it ran and refused
// nothing.
TEST_F(GpuTraining, LlamaWithCudnnAttentionStaysCloseToTheCpu) {
  MT_REQUIRE_GPU();
  const fs::path cpu = dir_ / "llama_cudnn_cpu", gpu = dir_ / "llama_cudnn_gpu";
  const std::string args = pretrain("llama") + "--precision bf16";
  ASSERT_EQ(run_cli(args + " --device cpu --output-dir " + cpu.string()).code, 0);
  const CliRun g = [&] {
    const ScopedEnv route("MT_ATTENTION_CUDNN", "1");
    return run_cli(args + " --device cuda --output-dir " + gpu.string());
  }();
  ASSERT_EQ(g.code, 0);
  EXPECT_NE(g.out.find("[cudnn attention] cuDNN"), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("not taken"), std::string::npos) << g.out;
  const double err = max_relative_loss_error(gpu, cpu, 20);
  std::cout << "  [max err] llama with cuDNN attention: 20 bf16 training losses, GPU vs CPU, relative: " << err << "\n";
  EXPECT_LE(err, 2e-2);
}

TEST_F(GpuTraining, BertClassifierOnTheGpuGivesTheCpuLosses) {
  MT_REQUIRE_GPU();
  const std::string args = "glue --task_name mrpc --model_name_or_path " + gpu_data_dir() +
                           "/models/hf-tiny-bert --data-dir " + gpu_data_dir() +
                           "/glue --max-train-samples 160 --max-eval-samples 32 --num_train_epochs 1 "
                           "--max_seq_length 128 --per_device_train_batch_size 8 --per_device_eval_batch_size 8 "
                           "--learning_rate 5e-5 --eval_steps 0 --seed 42 ";
  const fs::path cpu = dir_ / "cpu", gpu = dir_ / "gpu";
  ASSERT_EQ(run_cli(args + "--device cpu --output_dir " + cpu.string()).code, 0);
  ASSERT_EQ(run_cli(args + "--device cuda --output_dir " + gpu.string()).code, 0);
  const double err = max_relative_loss_error(gpu, cpu, 20);
  std::cout << "  [max err] BERT classifier (MRPC, dropout on): 20 f32 training losses, GPU vs CPU, relative: " << err
            << "\n";
  EXPECT_LE(err, 1e-4);
  const fs::path cpu16 = dir_ / "cpu_bf16", gpu16 = dir_ / "gpu_bf16";
  ASSERT_EQ(run_cli(args + "--precision bf16 --device cpu --output_dir " + cpu16.string()).code, 0);
  ASSERT_EQ(run_cli(args + "--precision bf16 --device cuda --output_dir " + gpu16.string()).code, 0);
  const double err16 = max_relative_loss_error(gpu16, cpu16, 20);
  std::cout << "  [max err] BERT classifier (MRPC, dropout on): 20 bf16 training losses, GPU vs CPU, relative: "
            << err16 << "\n";
  EXPECT_LE(err16, 2e-2);
}

TEST_F(GpuTraining, GreedyGenerationAndCheckpointsCrossDevices) {
  MT_REQUIRE_GPU();
  const std::string args = pretrain("gpt2") + "--save-steps 10 --keep-checkpoints 3 ";
  const fs::path whole = dir_ / "whole", split = dir_ / "split";
  ASSERT_EQ(run_cli(args + "--device cpu --output-dir " + whole.string()).code, 0);
  // 20 steps on the GPU with a checkpoint at step 10; everything after step 10 removed, so
  // the CPU resumes from the checkpoint the GPU wrote.
  ASSERT_EQ(run_cli(args + "--device cuda --output-dir " + split.string()).code, 0);
  ASSERT_TRUE(fs::exists(split / "checkpoints" / "step_00000010"));
  for (const auto& e : fs::directory_iterator(split / "checkpoints"))
    if (e.path().filename() != "step_00000010") fs::remove_all(e.path());
  fs::remove_all(split / "model");
  {
    std::vector<std::string> kept;
    std::ifstream in(split / "metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (nlohmann::json::parse(line).value("step", int64_t(0)) <= 10) kept.push_back(line);
    in.close();
    std::ofstream out(split / "metrics.jsonl", std::ios::trunc);
    for (const std::string& line : kept) out << line << "\n";
  }
  CliRun resumed = run_cli(args + "--device cpu --resume --output-dir " + split.string());
  ASSERT_EQ(resumed.code, 0);
  const double err = max_relative_loss_error(split, whole, 20);
  std::cout << "  [max err] GPU checkpoint resumed on the CPU vs the CPU run: " << err << "\n";
  EXPECT_LE(err, 1e-4);

  // Greedy, beam search and seeded sampling give the same ids on both devices.
  for (const std::string mode : {"", "--num-beams 3 ", "--temperature 0.8 --top-k 20 --seed 3 "}) {
    const std::string gen = "generate --model " + whole.string() + " --prompt-ids \"10 20 30\" --max-new-tokens 24 " + mode;
    CliRun on_cpu = run_cli(gen + "--device cpu"), on_gpu = run_cli(gen + "--device cuda");
    ASSERT_EQ(on_cpu.code, 0);
    ASSERT_EQ(on_gpu.code, 0);
    EXPECT_EQ(on_gpu.std_out, on_cpu.std_out) << "generated ids differ between devices: " << mode;
  }
}

// Encoder-decoders train on the GPU as on the CPU: small T5 and BART, 20 teacher-forced steps
// on a word-sorting task written here, then beam-search evaluation.
TEST_F(GpuTraining, Seq2SeqOnTheGpuGivesTheCpuLosses) {
  MT_REQUIRE_GPU();
  const std::vector<std::string> words = {"apple", "bird", "cat", "dog", "egg", "fish", "goat", "hat"};
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", rows;
  for (const auto& w : words) vocab += w + "\n";
  for (int i = 0; i < 200; ++i) {
    std::vector<std::string> ws = {words[size_t(i) % 8], words[size_t(i * 3 + 1) % 8], words[size_t(i * 5 + 2) % 8]};
    std::string src = ws[0] + " " + ws[1] + " " + ws[2];
    std::sort(ws.begin(), ws.end());
    rows += nlohmann::json{{"words", src}, {"sorted", ws[0] + " " + ws[1] + " " + ws[2]}}.dump() + "\n";
  }
  const std::string vocab_path = write("vocab.txt", vocab), data = write("rows.jsonl", rows);
  for (const std::string model : {"t5", "bart"}) {
    const std::string args = "seq2seq --config small-" + model + " --tokenizer " + vocab_path + " --data " + data +
                             " --eval-data " + data + " --source-field words --target-field sorted --steps 20 "
                             "--per-device-batch-size 10 --max-source-length 8 --max-target-length 8 --num-beams 2 ";
    const fs::path cpu = dir_ / (model + "_cpu"), gpu = dir_ / (model + "_gpu");
    ASSERT_EQ(run_cli(args + "--device cpu --output-dir " + cpu.string()).code, 0);
    ASSERT_EQ(run_cli(args + "--device cuda --output-dir " + gpu.string()).code, 0);
    const double err = max_relative_loss_error(gpu, cpu, 20);
    std::cout << "  [max err] small " << model << ": 20 seq2seq training losses, GPU vs CPU, relative: " << err << "\n";
    EXPECT_LE(err, 1e-4);
  }
}

// Processes sharing one GPU (host-staged collectives) train like one process: data=2 and model=2.
TEST_F(GpuTraining, TwoProcessesOnOneGpuEqualOne) {
  MT_REQUIRE_GPU();
  const std::string args = pretrain("gpt2") + "--device cuda ";
  const fs::path one = dir_ / "one", data2 = dir_ / "data2", model2 = dir_ / "model2";
  ASSERT_EQ(run_cli(args + "--output-dir " + one.string()).code, 0);
  const char* ld = std::getenv("LD_LIBRARY_PATH");
  const std::string mpirun = std::string(MT_MPIRUN) + " -np 2 -x OMP_NUM_THREADS=1" +
                             (ld ? std::string(" -x LD_LIBRARY_PATH") : std::string()) + " " + meshtrain_bin() + " ";
  // data=2: each process takes half of each batch of 8.
  std::string dp = args;
  dp.replace(dp.find("--per-device-batch-size 8"), 25, "--per-device-batch-size 4");
  ASSERT_EQ(run_command(mpirun + dp + "--mesh data=2 --output-dir " + data2.string(), "mpirun -np 2 ... --mesh data=2").code, 0);
  ASSERT_EQ(run_command(mpirun + args + "--model-shards 2 --output-dir " + model2.string(), "mpirun -np 2 ... --model-shards 2").code, 0);
  const double dp_err = max_relative_loss_error(data2, one, 20), tp_err = max_relative_loss_error(model2, one, 20);
  std::cout << "  [max err] 2 processes on one GPU vs 1, relative loss: data=2 " << dp_err << ", model=2 " << tp_err << "\n";
  EXPECT_LE(dp_err, 1e-4);
  EXPECT_LE(tp_err, 1e-4);
}

}  // namespace
}  // namespace mt::testing
