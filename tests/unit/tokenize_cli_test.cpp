// `meshtrain tokenize` end to end: the binary reads lines from stdin and prints one JSON
// object per line, equal to the library's encoding of the same text.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::tokenizers {
namespace {

namespace fs = std::filesystem;
const std::string kData = MT_DATA_DIR;

struct CliRun {
  int exit_code;
  std::vector<nlohmann::json> lines;
  std::string stderr_text;
};

CliRun run_cli(const std::string& args, const std::string& input) {
  char tmpl[] = "/tmp/mt_tok_cli_XXXXXX";
  const fs::path dir = mkdtemp(tmpl);
  std::ofstream(dir / "in.txt", std::ios::binary) << input;
  const std::string cmd = std::string(MT_MESHTRAIN_BIN) + " tokenize " + args + " < " + (dir / "in.txt").string() +
                          " > " + (dir / "out.txt").string() + " 2> " + (dir / "err.txt").string();
  const int rc = std::system(cmd.c_str());
  CliRun r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, {}, ""};
  std::ifstream out(dir / "out.txt");
  for (std::string line; std::getline(out, line);) r.lines.push_back(nlohmann::json::parse(line));
  std::ifstream err(dir / "err.txt");
  r.stderr_text.assign(std::istreambuf_iterator<char>(err), {});
  fs::remove_all(dir);
  return r;
}

TEST(TokenizeCli, SinglesMatchTheLibrary) {
  const std::string path = kData + "/models/hf-tiny-bert";
  const std::vector<std::string> lines = {"Hello, World!", "", "The quick brown fox jumps over the lazy dog.",
                                          "naïve café 中文"};
  std::string input;
  for (const auto& l : lines) input += l + "\n";
  const CliRun r = run_cli("--tokenizer " + path, input);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  ASSERT_EQ(r.lines.size(), lines.size());
  auto tok = load_tokenizer(path);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto e = tok->encode(lines[i]);
    EXPECT_EQ(r.lines[i].at("input_ids").get<std::vector<int32_t>>(), e.ids) << lines[i];
    EXPECT_EQ(r.lines[i].at("token_type_ids").get<std::vector<int32_t>>(), e.type_ids);
    EXPECT_EQ(r.lines[i].at("attention_mask").get<std::vector<int32_t>>(), e.attention_mask);
  }
  EXPECT_EQ(r.lines[0].at("input_ids").get<std::vector<int32_t>>(), (std::vector<int32_t>{101, 7592, 1010, 2088, 999, 102}));
}

TEST(TokenizeCli, PairsWithMaxLength) {
  const std::string path = kData + "/tokenizers/bert-base-uncased-tokenizer.json";
  const CliRun r = run_cli("--tokenizer " + path + " --pair --max-length 8",
                        "a sentence\tanother one here\r\nshort\tx\n");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.lines[0].at("input_ids").get<std::vector<int32_t>>(),
            (std::vector<int32_t>{101, 1037, 6251, 102, 2178, 2028, 2182, 102}));
  EXPECT_EQ(r.lines[0].at("token_type_ids").get<std::vector<int32_t>>(), (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(r.lines[1].at("input_ids").get<std::vector<int32_t>>(),
            (std::vector<int32_t>{101, 2460, 102, 1060, 102, 0, 0, 0}));
  EXPECT_EQ(r.lines[1].at("attention_mask").get<std::vector<int32_t>>(), (std::vector<int32_t>{1, 1, 1, 1, 1, 0, 0, 0}));
}

TEST(TokenizeCli, Gpt2AndErrors) {
  const CliRun g = run_cli("--tokenizer " + kData + "/models/hf-tiny-gpt2", "Hello, world!\n");
  ASSERT_EQ(g.exit_code, 0) << g.stderr_text;
  EXPECT_EQ(g.lines.at(0).at("input_ids").get<std::vector<int32_t>>(), (std::vector<int32_t>{15496, 11, 995, 0}));
  const CliRun no_tab = run_cli("--tokenizer " + kData + "/models/hf-tiny-bert --pair", "fine\tpair\nno tab here\n");
  EXPECT_EQ(no_tab.exit_code, 1);
  EXPECT_NE(no_tab.stderr_text.find("line 2: --pair expects two tab-separated fields"), std::string::npos)
      << no_tab.stderr_text;
  const CliRun missing = run_cli("--tokenizer /nonexistent/tok.json", "x\n");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.stderr_text.find("'/nonexistent/tok.json' does not exist"), std::string::npos) << missing.stderr_text;
}

}  // namespace
}  // namespace mt::tokenizers
