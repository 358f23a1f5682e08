// `meshtrain generate` end to end: llama2.c's stories260K with --prompt-ids (greedy ids as
// the PyTorch twin decodes them, reproducible sampling, beam search, stop at BOS), a HF
// GPT-2 directory with a text prompt, and clear errors.
#include <gtest/gtest.h>
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
  EXPECT_EQ(r.out, "473 473 473 473 473 473 473 483 339 260 403 305 299 302 310 1 407 465 465 465 465 465 465 465\n");
  // Temperature 0 is greedy; by default generation stops at BOS (1), which llama2.c starts stories with.
  CliRun t0 = run("generate --model " + kStories + " --prompt-ids \"1 403 407 261 378\" --max-new-tokens 24 --temperature 0");
  EXPECT_EQ(t0.code, 0);
  EXPECT_EQ(t0.out, "473 473 473 473 473 473 473 483 339 260 403 305 299 302 310 1\n");
  // bf16 matmuls: the same greedy path while the top logits are far apart; this 260K-parameter
  // model has near ties later on, where rounding the operands may pick another token.
  CliRun bf16 = run("generate --model " + kStories +
                    " --prompt-ids \"1 403 407 261 378\" --max-new-tokens 24 --no-stop --precision bf16");
  EXPECT_EQ(bf16.code, 0);
  EXPECT_EQ(bf16.out.substr(0, 43), "473 473 473 473 473 473 473 483 339 260 403") << bf16.out;
  std::istringstream words(bf16.out);
  EXPECT_EQ(std::distance(std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()), 24);
}

TEST(GenerateE2E, SamplingIsReproducibleAndBeamSearchRuns) {
  const std::string base = "generate --model " + kStories + " --prompt-ids 1 --max-new-tokens 20 --no-stop ";
  CliRun a = run(base + "--temperature 0.9 --top-k 40 --top-p 0.9 --seed 11");
  CliRun b = run(base + "--temperature 0.9 --top-k 40 --top-p 0.9 --seed 11");
  CliRun c = run(base + "--temperature 0.9 --top-k 40 --top-p 0.9 --seed 12");
  EXPECT_EQ(a.code, 0);
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  CliRun beam = run(base + "--num-beams 3 --length-penalty 1.0");
  EXPECT_EQ(beam.code, 0);
  int words = 0;
  for (size_t i = 0; i < beam.out.size(); ++i) words += beam.out[i] != ' ' && beam.out[i] != '\n' && (i == 0 || beam.out[i - 1] == ' ');
  EXPECT_EQ(words, 20);
}

TEST(GenerateE2E, HfGpt2DirectoryWithTextPrompt) {
  CliRun r = run("generate --model " + kModels + "hf-tiny-gpt2 --prompt \"Hello world\" --max-new-tokens 5");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("Hello world", 0), 0u) << r.out;
  CliRun ids = run("generate --model " + kModels + "hf-tiny-gpt2 --prompt-ids \"15496 995\" --max-new-tokens 5 --no-stop");
  EXPECT_EQ(ids.code, 0);
  int words = 0;
  for (size_t i = 0; i < ids.out.size(); ++i) words += ids.out[i] != ' ' && ids.out[i] != '\n' && (i == 0 || ids.out[i - 1] == ' ');
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
