// `meshtrain prepare-data` end to end on Debian's fortunes (15,217 documents): 1 and 3
// processes write the same token stream; pretraining from the shards gives the losses of
// pretraining from the text, bit for bit; --resume from shards continues exactly; errors
// name the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/run_metrics.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using PrepareDataE2E = TempDir;
const std::string kFortunes = "/usr/share/games/fortunes";

std::string stream_bytes(const fs::path& dir) {
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".bin") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  std::string all;
  for (const auto& s : shards) {
    std::ifstream in(s, std::ios::binary);
    all += std::string(std::istreambuf_iterator<char>(in), {});
  }
  return all;
}

TEST_F(PrepareDataE2E, ShardsTrainAsTheTextAndProcessesAgree) {
  const std::string one = (dir_ / "one").string(), three = (dir_ / "three").string();
  CliRun a = run_cli("prepare-data --data " + kFortunes + " --output " + one + " --shard-tokens 100000");
  ASSERT_EQ(a.code, 0);
  EXPECT_NE(a.out.find("15217 documents, 2546226 tokens in 26 shards (uint16"), std::string::npos) << a.out;
  CliRun b = run_cli_mpi(3, "prepare-data --data " + kFortunes + " --output " + three + " --shard-tokens 100000");
  ASSERT_EQ(b.code, 0);
  const std::string sa = stream_bytes(one), sb = stream_bytes(three);
  EXPECT_EQ(sa.size(), 2546226u * 2);
  EXPECT_TRUE(sa == sb) << "3 processes wrote another token stream";

  // No held-out text: a folder of documents holds out 1 in 50 of them, token shards their tail.
  const std::string args = "pretrain --steps 12 --seed 1 --save-steps 6 --eval-fraction 0 --output-dir ";
  ASSERT_EQ(run_cli(args + (dir_ / "text").string() + " --data " + kFortunes).code, 0);
  ASSERT_EQ(run_cli(args + (dir_ / "shards").string() + " --data " + three).code, 0);
  const auto lt = train_losses(dir_ / "text"), ls = train_losses(dir_ / "shards");
  ASSERT_EQ(lt.size(), 12u);
  EXPECT_EQ(lt, ls) << "shards and text trained differently";
  // The shard run as if stopped after its step-6 checkpoint, then resumed: the same 12 losses.
  const fs::path resumed = dir_ / "resumed";
  fs::copy(dir_ / "shards", resumed, fs::copy_options::recursive);
  fs::remove_all(resumed / "checkpoints" / "step_00000012");
  std::ifstream in(resumed / "metrics.jsonl");
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json::parse(line).value("step", int64_t(0)) <= 6) kept += line + "\n";
  in.close();
  std::ofstream(resumed / "metrics.jsonl") << kept;
  ASSERT_EQ(run_cli(args + resumed.string() + " --data " + three + " --resume").code, 0);
  EXPECT_EQ(train_losses(resumed), ls) << "the resumed run read other sequences";
}

// A corpus with no document separators is one document. It is cut into pieces of about 1 MiB
// at lines, so 2 processes share it (both write shards) and write the stream 1 process writes.
TEST_F(PrepareDataE2E, ALongDocumentIsSharedByTheProcesses) {
  const fs::path corpus = dir_ / "plays.txt";
  {
    std::ifstream in(std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt", std::ios::binary);
    const std::string text(std::istreambuf_iterator<char>(in), {});
    std::ofstream(corpus, std::ios::binary) << text << "\n" << text << "\n" << text;  // 3.3 MB
  }
  const std::string tok = " --tokenizer " + std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2/tokenizer.json";
  const std::string one = (dir_ / "one").string(), two = (dir_ / "two").string();
  CliRun a = run_cli("prepare-data --data " + corpus.string() + tok + " --output " + one);
  ASSERT_EQ(a.code, 0);
  EXPECT_NE(a.out.find("prepare-data: 1 documents, "), std::string::npos) << a.out;
  CliRun b = run_cli_mpi(2, "prepare-data --data " + corpus.string() + tok + " --output " + two);
  ASSERT_EQ(b.code, 0);
  EXPECT_TRUE(fs::exists(fs::path(two) / "shard_r00000_00000.bin"));
  EXPECT_TRUE(fs::exists(fs::path(two) / "shard_r00001_00000.bin")) << "process 1 got no part of the document";
  const std::string sa = stream_bytes(one), sb = stream_bytes(two);
  EXPECT_GT(sa.size(), 1000000u);
  EXPECT_TRUE(sa == sb) << "2 processes wrote another token stream";
}

TEST_F(PrepareDataE2E, ErrorsNameTheProblem) {
  const std::string out = (dir_ / "s").string();
  ASSERT_EQ(run_cli("prepare-data --data " + kFortunes + " --output " + out + " --shard-tokens 1000000").code, 0);
  CliRun again = run_cli("prepare-data --data " + kFortunes + " --output " + out);
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.out.find("already holds token shards (index.json): pass --overwrite"), std::string::npos) << again.out;
  CliRun pad = run_cli("pretrain --steps 1 --pad-documents --data " + out + " --output-dir " + (dir_ / "p").string());
  EXPECT_EQ(pad.code, 1);
  EXPECT_NE(pad.out.find("--pad-documents needs text"), std::string::npos) << pad.out;
  CliRun vocab = run_cli("pretrain --steps 1 --data " + out + " --tokenizer " + std::string(MT_DATA_DIR) +
                         "/models/hf-tiny-gpt2 --output-dir " + (dir_ / "v").string());
  EXPECT_EQ(vocab.code, 1);
  EXPECT_NE(vocab.out.find("was tokenized with a vocabulary of 257 ids, the tokenizer has 50257"), std::string::npos) << vocab.out;
  fs::resize_file(dir_ / "s" / "shard_r00000_00002.bin", 10);
  CliRun cut = run_cli("pretrain --steps 1 --data " + out + " --output-dir " + (dir_ / "c").string());
  EXPECT_EQ(cut.code, 1);
  EXPECT_NE(cut.out.find("shard_r00000_00002.bin: 10 bytes, but index.json says"), std::string::npos) << cut.out;
}

}  // namespace
}  // namespace mt::testing
