// Token shards (prepare-data's format): written and mapped back equal the token stream and
// PackedDataset's sequences, across shard boundaries, in uint16 and uint32; malformed
// directories are refused naming the file and what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "meshtrain/core/error.h"
#include "meshtrain/data/lm_dataset.h"
#include "meshtrain/data/token_shards.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

using TokenShards = TempDir;

std::vector<int64_t> stream(int64_t n, int64_t vocab) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back((i * 7919 + 13) % vocab);
  return t;
}

TEST_F(TokenShards, RoundTripEqualsPackedDatasetAcrossShardBoundaries) {
  for (int64_t vocab : {300, 70000}) {  // uint16, uint32
    const std::string dir = (dir_ / ("v" + std::to_string(vocab))).string();
    const std::vector<int64_t> tokens = stream(1000, vocab);
    data::TokenShardWriter w(dir, "shard_r00000", vocab, 97);  // boundaries inside sequences
    w.add(std::vector<int64_t>(tokens.begin(), tokens.begin() + 400));
    w.add(std::vector<int64_t>(tokens.begin() + 400, tokens.end()));
    auto shards = w.finish();
    EXPECT_EQ(shards.size(), 11u);
    data::write_token_shard_index(dir, vocab, 5, shards, "test");
    ASSERT_TRUE(data::is_token_shard_dir(dir));
    data::TokenShardDataset ds(dir, 16);
    data::PackedDataset packed(tokens, 16);
    ASSERT_EQ(ds.size(), packed.size());
    EXPECT_EQ(ds.num_tokens(), 1000);
    EXPECT_EQ(ds.separator_id(), std::optional<int64_t>(5));
    EXPECT_EQ(std::filesystem::file_size(std::filesystem::path(dir) / shards[0].first), 97u * (vocab > 65536 ? 4 : 2));
    for (int64_t i = 0; i < ds.size(); ++i) EXPECT_EQ(ds.get(i), packed.get(i)) << "sequence " << i;
  }
}

// A writer dropped mid-shard (prepare-data failing) leaves its full shards and no partial one:
// ids stream into a temp file that only a full shard or finish() renames into place.
TEST_F(TokenShards, ADroppedWriterLeavesNoPartialShard) {
  const std::vector<int64_t> tokens = stream(250, 300);
  {
    data::TokenShardWriter w(dir_.string(), "shard_r00000", 300, 100);
    w.add(tokens);
  }
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"shard_r00000_00000.bin", "shard_r00000_00001.bin"}));
  EXPECT_EQ(std::filesystem::file_size(dir_ / "shard_r00000_00001.bin"), 200u);
}

TEST_F(TokenShards, MalformedDirectoriesAreRefusedNamingTheProblem) {
  const std::string dir = (dir_ / "s").string();
  data::TokenShardWriter w(dir, "shard_r00000", 300, 100);
  w.add(stream(250, 300));
  auto shards = w.finish();
  data::write_token_shard_index(dir, 300, std::nullopt, shards, "test");
  auto refused = [&](const std::string& words) {
    try {
      data::TokenShardDataset ds(dir, 16);
      ADD_FAILURE() << "no error, expected " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  // A shard cut short.
  const auto last = std::filesystem::path(dir) / shards.back().first;
  std::filesystem::resize_file(last, 20);
  refused(last.string() + ": 20 bytes, but index.json says 50 uint16 tokens");
  // A missing shard.
  std::filesystem::remove(last);
  refused(last.string());
  // An index without its format, or with a bad dtype.
  write("s/index.json", R"({"dtype": "uint16", "vocab_size": 300, "shards": []})");
  refused("missing key 'format'");
  write("s/index.json", R"({"format": "meshtrain-token-shards", "dtype": "int8", "vocab_size": 300, "separator_id": null, "shards": []})");
  refused("dtype \"int8\"");
  // Token ids outside the vocabulary are refused when written.
  data::TokenShardWriter bad(dir, "x", 10, 100);
  EXPECT_THROW(bad.add({3, 10}), Error);
}

}  // namespace
}  // namespace mt::testing
