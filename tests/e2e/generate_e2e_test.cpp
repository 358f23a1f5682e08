// `meshtrain generate` end to end: llama2.c's stories260K with --prompt-ids (greedy ids as
// the PyTorch twin decodes them, reproducible sampling, beam search, stop at BOS), a HF
// GPT-2 directory with a text prompt, and clear errors.
#include <gtest/gtest.h>
#include <cstdlib>
#include <iterator>
#include <sstream>
#include <string>

#include "tests/support/cli_run.h"

namespace {

using mt::testing::CliRun;

const std::string kModels = std::string(MT_DATA_DIR) + "/models/";
const std::string kStories = kModels + "stories260K/stories260K.bin";

CliRun run(const std::string& args) { return mt::testing::run_cli(args); }

TEST(GenerateE2E, Stories260kGreedyPromptIds) {
  CliRun r = run("generate --model " + kStories + " --prompt-ids \"1 403 407 261 378\" --max-new-tokens 24 --no-stop");
  EXPECT_EQ(r.code, 0);
  // The PyTorch twin's greedy ids from the same weights (pretrained_oracle_test).
  EXPECT_EQ(r.std_out, "473 473 473 473 473 473 473 483 339 260 403 305 299 302 310 1 407 465 465 465 465 465 465 465\n");
  // The start-up line names the CPU path (on stderr, so stdout holds only the ids).
  EXPECT_NE(r.out.find("meshtrain: cpu: "), std::string::npos) << r.out;
  // Temperature 0 is greedy; by default generation stops at BOS (1), which llama2.c starts stories with.
  CliRun t0 = run("generate --model " + kStories + " --prompt-ids \"1 403 407 261 378\" --max-new-tokens 24 --temperature 0");
  EXPECT_EQ(t0.code, 0);
  EXPECT_EQ(t0.std_out, "473 473 473 473 473 473 473 483 339 260 403 305 299 302 310 1\n");
}

// Registered twice (tests/CMakeLists.txt): on oneDNN's native bf16 GEMM, and capped at AVX2
// where bf16 is widened to f32.
TEST(GenerateE2E, Bf16Stories260kGreedyMatchesF32WhileLogitsAreApart) {
  // The same greedy path while the top logits are far apart; this 260K-parameter model has
  // near ties later on, where rounding the operands may pick another token.
  CliRun bf16 = run("generate --model " + kStories +
                    " --prompt-ids \"1 403 407 261 378\" --max-new-tokens 24 --no-stop --precision bf16");
  EXPECT_EQ(bf16.code, 0);
  EXPECT_EQ(bf16.std_out.substr(0, 43), "473 473 473 473 473 473 473 483 339 260 403") << bf16.out;
  std::istringstream words(bf16.std_out);
  EXPECT_EQ(std::distance(std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()), 24);
  // One line says when bf16 is emulated, and only then.
  const bool emulated = bf16.out.find("bf16 emulated") != std::string::npos;
  EXPECT_EQ(bf16.out.find("--precision bf16 is emulated on this CPU") != std::string::npos, emulated) << bf16.out;
  if (const char* path = std::getenv("MT_TEST_BF16_PATH")) {
    EXPECT_EQ(emulated, std::string(path) == "emulated") << bf16.out;
  }
}

TEST(GenerateE2E, SamplingIsReproducibleAndBeamSearchRuns) {
  const std::string base = "generate --model " + kStories + " --prompt-ids 1 --max-new-tokens 20 --no-stop ";
  CliRun a = run(base + "--temperature 0.9 --top-k 40 --top-p 0.9 --seed 11");
  CliRun b = run(base + "--temperature 0.9 --top-k 40 --top-p 0.9 --seed 11");
  CliRun c = run(base + "--temperature 0.9 --top-k 40 --top-p 0.9 --seed 12");
  EXPECT_EQ(a.code, 0);
  EXPECT_EQ(a.std_out, b.std_out);
  EXPECT_NE(a.std_out, c.std_out);
  CliRun beam = run(base + "--num-beams 3 --length-penalty 1.0");
  EXPECT_EQ(beam.code, 0);
  int words = 0;
  for (size_t i = 0; i < beam.std_out.size(); ++i) words += beam.std_out[i] != ' ' && beam.std_out[i] != '\n' && (i == 0 || beam.std_out[i - 1] == ' ');
  EXPECT_EQ(words, 20);
}

TEST(GenerateE2E, HfGpt2DirectoryWithTextPrompt) {
  CliRun r = run("generate --model " + kModels + "hf-tiny-gpt2 --prompt \"Hello world\" --max-new-tokens 5");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.std_out.rfind("Hello world", 0), 0u) << r.out;
  CliRun ids = run("generate --model " + kModels + "hf-tiny-gpt2 --prompt-ids \"15496 995\" --max-new-tokens 5 --no-stop");
  EXPECT_EQ(ids.code, 0);
  int words = 0;
  for (size_t i = 0; i < ids.std_out.size(); ++i) words += ids.std_out[i] != ' ' && ids.std_out[i] != '\n' && (i == 0 || ids.std_out[i - 1] == ' ');
  EXPECT_EQ(words, 5);
}

TEST(GenerateE2E, ClearErrors) {
  CliRun missing = run("generate --model /nonexistent.bin --prompt-ids 1");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("/nonexistent.bin"), std::string::npos);
  CliRun no_tok = run("generate --model " + kStories + " --prompt \"Once upon a time\"");
  EXPECT_NE(no_tok.code, 0);
  EXPECT_NE(no_tok.out.find("tokenizer"), std::string::npos);
  CliRun bad_ids = run("generate --model " + kStories + " --prompt-ids \"1 x\"");
  EXPECT_NE(bad_ids.code, 0);
  EXPECT_NE(bad_ids.out.find("'x' is not an integer"), std::string::npos);
  CliRun range = run("generate --model " + kStories + " --prompt-ids \"1 600\"");
  EXPECT_NE(range.code, 0);
  EXPECT_NE(range.out.find("token 600"), std::string::npos);
  CliRun bert = run("generate --model " + kModels + "hf-tiny-bert --prompt-ids \"101 102\"");
  EXPECT_NE(bert.code, 0);
  EXPECT_NE(bert.out.find("cannot generate"), std::string::npos);
  CliRun neither = run("generate --model " + kStories);
  EXPECT_NE(neither.code, 0);
}

}  // namespace
