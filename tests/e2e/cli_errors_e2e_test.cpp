// Bad flags and malformed inputs: every command exits non-zero with a message naming the
// flag, file, line or shape — and never loses what a run saved.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

const std::string kGlue = std::string(MT_DATA_DIR) + "/glue";
const std::string kVocab = std::string(MT_DATA_DIR) + "/tokenizers/bert-base-uncased-vocab.txt";
const std::string kShakespeare = std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt";

class CliErrors : public TempDir {
 protected:
  void expect_failure(const std::string& args, const std::vector<std::string>& fragments) {
    CliRun r = run_cli(args);
    EXPECT_NE(r.code, 0) << args;
    for (const auto& f : fragments) EXPECT_NE(r.out.find(f), std::string::npos) << "missing '" << f << "' in:\n" << r.out;
    EXPECT_EQ(r.out.find("Segmentation"), std::string::npos);
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos);
  }
};

// The CPU variables a user may set are checked: a value that is not one names the variable
// and what it takes; MESHTRAIN_CPU_BF16_GEMM=widened is honoured and said on the CPU line.
TEST_F(CliErrors, CpuVariablesAreCheckedAndNamed) {
  const std::string run = " pretrain --precision bf16 --seq-len 32 --dry-run --output-dir " + (dir_ / "cpu").string();
  CliRun gemm = run_command("MESHTRAIN_CPU_BF16_GEMM=fastest " + meshtrain_bin() + run, "(bad bf16 GEMM choice)");
  EXPECT_NE(gemm.code, 0);
  EXPECT_NE(gemm.out.find("meshtrain: [cpu] MESHTRAIN_CPU_BF16_GEMM='fastest': expected auto, native or widened"),
            std::string::npos)
      << gemm.out;
  CliRun isa = run_command("MESHTRAIN_MAX_CPU_ISA=avx9 " + meshtrain_bin() + run, "(bad ISA cap)");
  EXPECT_NE(isa.code, 0);
  EXPECT_NE(isa.out.find("MESHTRAIN_MAX_CPU_ISA='avx9' is not an instruction set; expected one of: sse41"),
            std::string::npos)
      << isa.out;
  CliRun widened = run_command("MESHTRAIN_CPU_BF16_GEMM=widened " + meshtrain_bin() + run, "(widened bf16 GEMMs)");
  ASSERT_EQ(widened.code, 0) << widened.out;
  // Where oneDNN has bf16 kernels the choice is named; below AVX-512 bf16 is widened anyway.
  EXPECT_TRUE(widened.out.find("bf16 widened to f32 (MESHTRAIN_CPU_BF16_GEMM=widened)") != std::string::npos ||
              widened.out.find("bf16 emulated (widened to f32; MESHTRAIN_CPU_BF16_GEMM=widened has no oneDNN kernel") !=
                  std::string::npos)
      << widened.out;
}

// Nothing typed is silently ignored: a mistyped command or flag names the nearest real one,
// in the order typed; an unknown config key names the nearest key and the known ones, while
// Hugging Face's aliases are honoured.
TEST_F(CliErrors, TyposNameTheNearestCommandFlagOrKey) {
  CliRun c = run_cli("generat --model x");
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.out.find("unknown command 'generat'; did you mean 'generate'?"), std::string::npos) << c.out;
  CliRun f = run_cli("pretrain --stepz 3 --lr 1e-3");
  EXPECT_NE(f.code, 0);
  const size_t steps = f.out.find("unknown flag '--stepz' for pretrain; did you mean '--steps'?");
  const size_t lr = f.out.find("unknown flag '--lr' for pretrain; did you mean '--learning-rate'?");
  EXPECT_NE(steps, std::string::npos) << f.out;
  EXPECT_NE(lr, std::string::npos) << f.out;
  EXPECT_LT(steps, lr) << "not in the order typed:\n" << f.out;
  EXPECT_EQ(f.out.find("'3'"), std::string::npos) << "a flag's value reported as an argument:\n" << f.out;

  const std::string unknown = write("unknown.json", R"({"n_layers": 2, "hidden_size": 64})");
  expect_failure("pretrain --model gpt2 --steps 1 --config " + unknown + " --output-dir " + (dir_ / "u").string(),
                 {"[pretrain] " + unknown + ": unknown key 'n_layers' for gpt2 (did you mean 'n_layer'?); known keys: "
                  "activation_function, attn_pdrop, embd_pdrop, hidden_size, initializer_range"});
  const std::string both = write("both.json", R"({"n_embd": 32, "hidden_size": 64})");
  expect_failure("pretrain --model gpt2 --steps 1 --config " + both + " --output-dir " + (dir_ / "b").string(),
                 {"'hidden_size' is gpt2's 'n_embd', given both as 64 and 32"});
  // HF's aliases size the model: hidden_size is n_embd, num_hidden_layers n_layer.
  const std::string aliases = write("aliases.json", R"({"hidden_size": 48, "num_hidden_layers": 1, "n_head": 4})");
  CliRun ok = run_cli("pretrain --model gpt2 --steps 1 --seq-len 32 --config " + aliases + " --output-dir " +
                      (dir_ / "a").string());
  ASSERT_EQ(ok.code, 0) << ok.out;
  const nlohmann::json saved = nlohmann::json::parse(std::ifstream(dir_ / "a" / "model" / "config.json"));
  EXPECT_EQ(saved.at("n_embd"), 48);
  EXPECT_EQ(saved.at("n_layer"), 1);
}

// Resume explains itself: a changed model names the keys that differ; a changed --steps keeps
// the learning-rate schedule the run was planned with and says so; a warmup longer than the
// run is scaled to a tenth of it, with a note; --resume without checkpoints starts fresh.
// One spelling across commands: Hugging Face's underscores and names work with every training
// command (pretrain takes --max_steps, --learning_rate, --per_device_train_batch_size,
// --output_dir); glue refuses run_flax_glue's --max_predict_samples by name, with the reason.
TEST_F(CliErrors, HuggingFaceSpellingsWorkEverywhere) {
  CliRun r = run_cli("pretrain --data " + kShakespeare + " --seq-len 32 --sample_every 0 --max_steps 2 --learning_rate 1e-3 "
                     "--per_device_train_batch_size 4 --warmup_steps 1 --output_dir " + (dir_ / "hf").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 steps of 4 sequences"), std::string::npos) << r.out;
  // Not on a terminal, --logging_steps N gives a progress line every N steps, none skipped.
  CliRun logged = run_cli("pretrain --data " + kShakespeare + " --seq-len 32 --sample-every 0 --steps 12 "
                          "--logging_steps 3 --output-dir " + (dir_ / "logged").string());
  ASSERT_EQ(logged.code, 0) << logged.out;
  for (int s : {3, 6, 9, 12})
    EXPECT_NE(logged.out.find("train " + std::to_string(s) + "/12 ["), std::string::npos) << "step " << s << ":\n"
                                                                                          << logged.out;
  // --dry-run prints the plan and the training state per rank and trains nothing.
  CliRun dry = run_cli("pretrain --model gpt2 --data " + kShakespeare + " --seq-len 32 --dry-run --output-dir " +
                       (dir_ / "dry").string());
  ASSERT_EQ(dry.code, 0) << dry.out;
  EXPECT_NE(dry.out.find("sharding plan on mesh data=1,model=1"), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("training state per rank: weights "), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("dry run: one step's memory per rank: weights "), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("activations and temporaries"), std::string::npos) << dry.out;
  EXPECT_FALSE(fs::exists(dir_ / "dry" / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir_ / "dry" / "checkpoints"));
  // --max-grad-norm 0 turns clipping off, as in Hugging Face; a negative norm is refused.
  CliRun unclipped = run_cli("pretrain --data " + kShakespeare + " --seq-len 32 --sample-every 0 --steps 2 "
                             "--max-grad-norm 0 --output-dir " + (dir_ / "unclipped").string());
  EXPECT_EQ(unclipped.code, 0) << unclipped.out;
  expect_failure("pretrain --data " + kShakespeare + " --max-grad-norm -1", {"--max-grad-norm", "-1"});
  expect_failure("glue --task rte --data-dir " + kGlue + " --config small --max_predict_samples 5",
                 {"--max-predict-samples", "writes no test-split predictions: use --max-eval-samples"});
}

TEST_F(CliErrors, ResumeExplainsItself) {
  const std::string run = (dir_ / "run").string();
  const std::string base = "pretrain --model gpt2 --data " + kShakespeare + " --seq-len 32 --sample-every 0 --save-steps 2 ";
  CliRun fresh = run_cli(base + "--steps 4 --resume --output-dir " + run);
  ASSERT_EQ(fresh.code, 0) << fresh.out;
  EXPECT_NE(fresh.out.find("holds no checkpoint (the run ended or was killed before its first one); starting fresh"),
            std::string::npos) << fresh.out;
  EXPECT_NE(fresh.out.find("[pretrain] --warmup-steps 50 is not below the run's 4 steps: warming up over 1 step "
                           "instead"),
            std::string::npos) << fresh.out;
  const std::string deeper = write("deeper.json", R"({"n_layer": 3})");
  expect_failure(base + "--steps 4 --resume --config " + deeper + " --output-dir " + run,
                 {"its model config differs from this run's: n_layer: 4 \u2192 3"});
  CliRun longer = run_cli(base + "--steps 6 --resume --output-dir " + run);
  ASSERT_EQ(longer.code, 0) << longer.out;
  EXPECT_NE(longer.out.find("resuming a run planned for 4 steps with 6 steps: the learning rate keeps its 4-step "
                            "schedule (it stays at the schedule's final value after step 4); --reschedule fits it "
                            "to 6 steps instead"),
            std::string::npos) << longer.out;
  CliRun rescheduled = run_cli(base + "--steps 8 --resume --reschedule --output-dir " + run);
  ASSERT_EQ(rescheduled.code, 0) << rescheduled.out;
  EXPECT_NE(rescheduled.out.find("--reschedule: the learning-rate schedule planned for 4 steps now spans 8"),
            std::string::npos) << rescheduled.out;
}

TEST_F(CliErrors, FlagsAreChecked) {
  expect_failure("pretrain --no-such-flag", {"--no-such-flag"});
  expect_failure("pretrain --steps -3", {"--steps", "must be a positive integer, got '-3'"});
  expect_failure("pretrain --model bert", {"--model", "bert"});
  expect_failure("glue --data-dir " + kGlue, {"--data-dir requires --task"});
  expect_failure("glue --config small", {"pass --task NAME --data-dir DIR (a GLUE task) or --train-file F --validation-file F"});
  expect_failure("glue --task nope --config small --data-dir " + kGlue, {"nope"});
  expect_failure("glue --task rte --data-dir " + kGlue, {"pass --model DIR (pretrained) or --config small|FILE"});
  expect_failure("eval", {"--model is required"});
  expect_failure("pretrain --precision fp8", {"--precision", "fp8", "f32, tf32, bf16, f16 or bf16-matmul"});
  expect_failure("pretrain --precision f16 --loss-scale 0", {"--loss-scale", "expected dynamic or a positive number, got '0'"});
  expect_failure("pretrain --precision f16 --loss-scale lots", {"--loss-scale", "'lots'"});
  expect_failure("pretrain --precision bf16 --loss-scale 1024 --steps 1 --output-dir " + (dir_ / "scaled").string(),
                 {"loss scaling applies to --precision f16", "--precision bf16"});
  expect_failure("pretrain --profile 5:3", {"--profile", "'5:3' ends before it starts"});
  expect_failure("pretrain --profile x", {"--profile", "START:END", "'x'"});
  expect_failure("pretrain --steps 4 --profile 3:9 --output-dir " + (dir_ / "profiled").string(),
                 {"steps 3:9 are outside this run, which takes steps 1 to 4"});
  EXPECT_FALSE(fs::exists(dir_ / "profiled" / "metrics.jsonl"));  // refused before the first step
  expect_failure("plot " + (dir_ / "no_run").string(), {"cannot read", "no_run", "metrics.jsonl"});
  expect_failure("generate --model x --prompt-ids 1 --precision fp8", {"--precision", "fp8"});
  // What a first-hour user tried: CLI11's own range checks printed a 300-digit bound; HF's
  // --bf16 points at --precision; eval refuses options of another kind of model.
  const std::string gpt2 = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2";
  const std::string bert = std::string(MT_DATA_DIR) + "/models/hf-tiny-bert";
  expect_failure("finetune --model " + gpt2 + " --data " + gpt2 + "/config.json --seq-len 0",
                 {"--seq-len", "must be a positive integer, got '0'"});
  expect_failure("glue --task rte --max-seq-length abc", {"--max-seq-length", "must be an integer from 8 to 4096, got 'abc'"});
  expect_failure("pretrain --bf16", {"unknown flag '--bf16' for pretrain; did you mean '--precision bf16'?"});
  // A --seq-len beyond the model's positions is capped there, said before training (batches cut
  // to their rows used to run until one exceeded them, then stop).
  std::string text_rows;
  for (int i = 0; i < 20; ++i) text_rows += "{\"text\": \"row " + std::to_string(i) + " of a few words\"}\n";
  const std::string rows = write("rows.jsonl", text_rows);
  CliRun capped = run_cli("finetune --model " + gpt2 + " --data " + rows + " --text-field text --seq-len 2048 --steps 1 "
                          "--check-rows 0 --output-dir " + (dir_ / "long").string());
  ASSERT_EQ(capped.code, 0) << capped.out;
  EXPECT_NE(capped.out.find("finetune: --seq-len 2048 exceeds the 1024 positions of " + gpt2 + "; using 1024"),
            std::string::npos) << capped.out;
  expect_failure("eval --model " + gpt2 + " --task mrpc --data-dir " + kGlue,
                 {"--task, --data-dir and --validation-file are for BERT classifiers", "gpt2", "--data FILE"});
  expect_failure("eval --model " + bert + " --task mrpc --data-dir " + kGlue,
                 {"BertForMaskedLM, not a sequence classifier"});
  CliRun help = run_cli("pretrain --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--per-device-batch-size"), std::string::npos);
}

// The success path of --profile through the CLI: the files, the printed table and the picture.
TEST_F(CliErrors, ProfileWritesTraceTableAndCurves) {
  const fs::path run = dir_ / "profiled_run";
  CliRun r = run_cli("pretrain --steps 3 --seq-len 32 --profile 2:3 --sample-every 0 --peak-gflops 100 --output-dir " +
                     run.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("op profile: 2 step(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MFU"), std::string::npos) << r.out;
  for (const char* f : {"profile/trace.json", "profile/ops.txt", "profile/ops.json", "curves.svg"})
    EXPECT_TRUE(fs::exists(run / f)) << f;
  std::ifstream jl(run / "metrics.jsonl");
  std::string first;
  std::getline(jl, first);
  EXPECT_NE(first.find("\"mfu\""), std::string::npos) << first;
}

TEST_F(CliErrors, PlotOverlaysRuns) {
  for (const char* run : {"a", "b"}) {
    fs::create_directories(dir_ / run);
    write(std::string(run) + "/metrics.jsonl",
          "{\"step\":1,\"split\":\"train\",\"loss\":3.0}\n{\"step\":2,\"split\":\"train\",\"loss\":2.5}\n"
          "{\"step\":2,\"split\":\"eval\",\"eval_loss\":2.7}\n");
  }
  const std::string svg = (dir_ / "both.svg").string();
  CliRun r = run_cli("plot " + (dir_ / "a").string() + " " + (dir_ / "b").string() + " --metric loss -o " + svg);
  EXPECT_EQ(r.code, 0) << r.out;
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("data-series=\"a/train/loss\" data-points=\"2\""), std::string::npos) << text;
  EXPECT_NE(text.find("data-series=\"b/train/loss\" data-points=\"2\""), std::string::npos);
  expect_failure("plot " + (dir_ / "a").string() + " --metric nope -o " + svg, {"no run logged a metric named 'nope'; logged: eval_loss, loss"});
  // Two runs of one name (x/r, y/r, one given as its metrics.jsonl) are told apart by their
  // parents; -o's folder is made.
  for (const char* run : {"x/r", "y/r"}) {
    fs::create_directories(dir_ / run);
    fs::copy_file(dir_ / "a" / "metrics.jsonl", dir_ / run / "metrics.jsonl");
  }
  const fs::path deeper = dir_ / "plots" / "r.svg";
  CliRun same = run_cli("plot " + (dir_ / "x" / "r").string() + " " + (dir_ / "y" / "r" / "metrics.jsonl").string() +
                        " --metric loss -o " + deeper.string());
  ASSERT_EQ(same.code, 0) << same.out;
  std::ifstream again(deeper);
  const std::string drawn((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_NE(drawn.find("data-series=\"x/r/train/loss\""), std::string::npos) << drawn;
  EXPECT_NE(drawn.find("data-series=\"y/r/train/loss\""), std::string::npos) << drawn;
}

TEST_F(CliErrors, MissingAndMalformedFilesAreNamed) {
  const std::string out = " --output-dir " + (dir_ / "run").string();
  expect_failure("pretrain --data /nonexistent/corpus.txt --steps 1" + out, {"/nonexistent/corpus.txt"});
  write("config.json", "{\"n_layer\": ");
  expect_failure("pretrain --model gpt2 --data " + kShakespeare + " --config " + (dir_ / "config.json").string() + " --steps 1" + out,
                 {"config.json"});
  write("bad_vocab.json", "{\"n_embd\": 64, \"vocab_size\": 10}");
  expect_failure("pretrain --model gpt2 --data " + kShakespeare + " --config " + (dir_ / "bad_vocab.json").string() +
                     " --steps 1" + out,
                 {"vocab_size 10 is smaller than the tokenizer's 257 ids"});
  // A GLUE directory whose RTE train.tsv has a row with a missing column and one with an unknown label.
  fs::create_directories(dir_ / "glue" / "RTE");
  std::ofstream(dir_ / "glue" / "RTE" / "train.tsv") << "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n";
  std::ofstream(dir_ / "glue" / "RTE" / "dev.tsv") << "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n";
  const std::string glue = "glue --task rte --config small --tokenizer " + kVocab + " --data-dir " + (dir_ / "glue").string() + out;
  expect_failure(glue, {"RTE/train.tsv:3"});
  std::ofstream(dir_ / "glue" / "RTE" / "train.tsv") << "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n";
  expect_failure(glue, {"RTE/dev.tsv:2", "label 'maybe' is not one of entailment, not_entailment"});
}

TEST_F(CliErrors, MeshesMustFitTheProcessesAndNameKnownAxes) {
  const std::string base = "pretrain --data " + kShakespeare + " --steps 1 --output-dir " + (dir_ / "run").string();
  expect_failure(base + " --mesh data=2,model=2", {"data=2,model=2", "4"});
  expect_failure(base + " --mesh data=1,pipe=1", {"axes 'data' and 'model', not 'pipe'"});
  expect_failure(base + " --mesh foo=2", {"axes 'data' and 'model', not 'foo'"});  // before the process count
  // Under mpirun every rank reports the error and the job ends instead of hanging.
  CliRun r = run_cli_mpi(2, base + " --mesh data=3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("mesh 'data=3' has 3 devices but the world has 2 ranks"), std::string::npos);
  EXPECT_EQ(r.out.find("has not completed after"), std::string::npos) << "a rank hung instead of failing";
}

TEST_F(CliErrors, NothingSavedIsLost) {
  const std::string run = (dir_ / "run").string();
  const std::string base = "pretrain --data " + kShakespeare + " --seq-len 32 --per-device-batch-size 4 --steps 3 --output-dir " + run;
  ASSERT_EQ(run_cli(base).code, 0);
  const fs::path ckpt = fs::path(run) / "checkpoints" / "step_00000003";
  ASSERT_TRUE(fs::exists(ckpt / "meta.json"));
  expect_failure(base, {"holds checkpoints of an earlier run", "--resume", "--overwrite"});
  EXPECT_TRUE(fs::exists(ckpt / "meta.json"));
  // Resuming with another model shape names the checkpoint and the flags that differ.
  expect_failure("pretrain --data " + kShakespeare + " --seq-len 48 --per-device-batch-size 4 --steps 6 --resume --output-dir " + run,
                 {"cannot resume from", "step_00000003", "--seq-len"});
  // ...and with another global batch, the data position's requirement.
  expect_failure("pretrain --data " + kShakespeare + " --seq-len 32 --per-device-batch-size 2 --steps 6 --resume --output-dir " + run,
                 {"cannot resume the data position", "global batch"});
  EXPECT_TRUE(fs::exists(ckpt / "meta.json"));
  // A corrupt checkpoint is refused by name; generate does not touch the run.
  std::ofstream(ckpt / "rank_0.safetensors", std::ios::trunc) << "garbage";
  expect_failure("generate --model " + run + " --prompt hi", {"rank_0.safetensors"});
}

// --overwrite discards everything of the earlier run, including its tokenizer files: a byte
// run after a GPT-2-tokenizer run must not pick up the old tokenizer.json-less vocab files.
TEST_F(CliErrors, OverwriteStartsClean) {
  const std::string run = (dir_ / "run").string();
  const std::string base = "pretrain --data " + kShakespeare + " --seq-len 16 --per-device-batch-size 2 --steps 1 --sample-tokens 4 "
                           "--eval-fraction 0 --output-dir " + run;
  ASSERT_EQ(run_cli(base + " --tokenizer " + std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2").code, 0);
  EXPECT_TRUE(fs::exists(fs::path(run) / "model" / "tokenizer.json"));
  ASSERT_EQ(run_cli(base + " --overwrite").code, 0);
  EXPECT_FALSE(fs::exists(fs::path(run) / "model" / "tokenizer.json"));
  std::ifstream config(fs::path(run) / "model" / "config.json");
  std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"vocab_size\": 320"), std::string::npos) << text;  // 257 byte ids, rounded up to 64
}

}  // namespace
}  // namespace mt::testing
