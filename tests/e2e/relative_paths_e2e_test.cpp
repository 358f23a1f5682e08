// Every path flag takes relative paths of every kind (bare names, ./, ../), run from another
// working directory than the project's: pretrain with the tokenizer given by its bare file
// name into an output folder whose model/ already exists (this failed on newer libstdc++ with
// "cannot check file equivalence", and from inside model/ deleted the tokenizer it was given),
// resume, generate, eval, plot, and glue.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/cli_run.h"
#include "tests/support/llama_tokenizer_fixture.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

class RelativePathsE2E : public TempDir {
 protected:
  // `meshtrain <args>` run from `cwd`.
  CliRun run_in(const fs::path& cwd, const std::string& args) {
    return run_command("cd '" + cwd.string() + "' && " + MT_MESHTRAIN_BIN + " " + args,
                       "(cd " + fs::relative(cwd, dir_).string() + ") meshtrain " + args);
  }
};

TEST_F(RelativePathsE2E, EveryCommandFromAnotherWorkingDirectory) {
  const std::string data = std::string(MT_DATA_DIR);
  const std::string text = test::shakespeare_prefix(300000);
  fs::create_directories(dir_ / "tok");
  fs::create_directories(dir_ / "data");
  fs::create_directories(dir_ / "runs" / "lm" / "model");  // an output folder whose model/ exists
  std::ofstream(dir_ / "tok" / "tokenizer.json") << test::llama_tokenizer_json(text, {.name = "rel"}, 300).dump();
  std::ofstream(dir_ / "data" / "text.txt") << text.substr(0, 40000);
  std::ofstream(dir_ / "data" / "llama.json") << R"({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128})";
  const std::string lm = "--model llama --seq-len 32 --per-device-batch-size 4 --eval-fraction 0.05 --warmup-steps 1 ";

  CliRun first = run_in(dir_ / "tok", "pretrain " + lm + "--config ../data/llama.json --tokenizer tokenizer.json --data ../data/text.txt --output-dir ../runs/lm --steps 2");
  ASSERT_EQ(first.code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "lm" / "model" / "tokenizer.json"));
  // Resume from the project-less root with ./ paths, the tokenizer now being the run's own copy.
  CliRun resumed = run_in(dir_, "pretrain " + lm + "--config ./data/llama.json --tokenizer ./runs/lm/model --data ./data/text.txt --output-dir ./runs/lm --steps 3 --resume");
  ASSERT_EQ(resumed.code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "lm" / "checkpoints" / "step_00000003" / "meta.json"));
  // From inside the run's model/ folder, the tokenizer by its bare name is the run's own file:
  // it must be recognized as such (an empty parent path), not deleted before being copied.
  CliRun inside = run_in(dir_ / "runs" / "lm" / "model",
                         "pretrain " + lm + "--config ../../../data/llama.json --tokenizer tokenizer.json --data ../../../data/text.txt --output-dir .. --steps 4 --resume");
  ASSERT_EQ(inside.code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "lm" / "model" / "tokenizer.json"));

  CliRun gen = run_in(dir_ / "runs", "generate --model ./lm --prompt \"To be\" --max-new-tokens 4");
  ASSERT_EQ(gen.code, 0);
  EXPECT_EQ(gen.std_out.rfind("To be", 0), 0u);
  CliRun gen_model = run_in(dir_ / "runs" / "lm", "generate --model model --prompt-ids \"1 5\" --max-new-tokens 3 --no-stop");
  ASSERT_EQ(gen_model.code, 0);
  CliRun ev = run_in(dir_ / "data", "eval --model ../runs/lm --data text.txt --seq-len 32 --output ../runs/eval.json");
  ASSERT_EQ(ev.code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "eval.json"));

  // glue: a GLUE folder and a vocabulary given relative to the working directory.
  fs::create_directories(dir_ / "bert");
  fs::copy_file(data + "/tokenizers/bert-base-uncased-vocab.txt", dir_ / "bert" / "vocab.txt");
  fs::create_directory_symlink(fs::absolute(data + "/glue/MRPC"), dir_ / "mrpc");
  CliRun glue = run_in(dir_ / "bert", "glue --task mrpc --data-dir ../mrpc --config small --tokenizer vocab.txt --output-dir ../runs/glue "
                                      "--max-steps 2 --max-train-samples 16 --max-eval-samples 8 --max-seq-length 32 "
                                      "--per-device-train-batch-size 4 --per-device-eval-batch-size 4");
  ASSERT_EQ(glue.code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "glue" / "model" / "vocab.txt"));

  CliRun plot = run_in(dir_ / "runs" / "lm", "plot . ../glue/ -o ../curves.svg");
  ASSERT_EQ(plot.code, 0);
  std::ifstream svg(dir_ / "runs" / "curves.svg");
  const std::string picture((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(picture.find(">lm: "), std::string::npos) << "runs are labelled with their folders' names, not '.'";
  EXPECT_NE(picture.find(">glue: "), std::string::npos);
}

}  // namespace
}  // namespace mt::testing
