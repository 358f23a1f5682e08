// Text LM datasets: documents split on "<|endoftext|>" or fortune's "%" lines, one padded
// example per document, or packed fixed-length sequences across document boundaries.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"
#include "tests/support/temp_dir.h"

#include <filesystem>
#include <fstream>

#include "meshtrain/meshtrain.h"

namespace mt::data {
namespace {

using mt::testing::expect_error;
using mt::testing::TempDir;

namespace fs = std::filesystem;
const std::string kText = std::string(MT_DATA_DIR) + "/text/";

// Byte-level tokenizer: id = byte value, so expected token streams are easy to derive.
std::vector<int64_t> bytes(const std::string& s) {
  std::vector<int64_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}



TEST(Documents, TinyStoriesSplitOnEndOfText) {
  const auto docs = read_documents(kText + "tinystories_sample.txt");  // automatic
  ASSERT_EQ(docs.size(), 5u);
  EXPECT_EQ(docs, read_documents(kText + "tinystories_sample.txt", DocumentSplit::literal("<|endoftext|>")));
  EXPECT_EQ(docs[0].rfind("Once upon a time there was a little boy named Ben.", 0), 0u);
  const std::vector<size_t> sizes = {734, 661, 513, 855, 954};  // bytes, as Python splits them
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(docs[i].size(), sizes[i]) << i;
    EXPECT_EQ(docs[i].find("<|endoftext|>"), std::string::npos);
    EXPECT_NE(docs[i].front(), '\n');
    EXPECT_NE(docs[i].back(), '\n');
  }
  // Without a split the file is one document.
  EXPECT_EQ(read_documents(kText + "tinystories_sample.txt", DocumentSplit::none()).size(), 1u);
}

TEST_F(TempDir, FortunesPercentLines) {
  const std::string text =
      "%\n"
      "First fortune.\n"
      "%\n"
      "  ASCII art keeps\n  its indentation\n"
      "%\r\n"
      "%\n"
      "50% off: a % inside a line is text\n"
      "%\n";
  const auto docs = split_documents(text);  // automatic picks percent lines
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "First fortune.");
  EXPECT_EQ(docs[1], "  ASCII art keeps\n  its indentation");
  EXPECT_EQ(docs[2], "50% off: a % inside a line is text");

  // A directory: text files in name order; .dat indexes, .u8 links, hidden files and
  // subdirectories are skipped.
  write("b", "beta one\n%\nbeta two\n");
  write("a", "alpha\n%\n");
  write("a.dat", "\x01\x02binary index");
  fs::create_symlink(dir_ / "a", dir_ / "a.u8");
  write(".hidden", "secret\n%\n");
  fs::create_directories(dir_ / "off");
  write("off/c", "offensive\n%\n");
  EXPECT_EQ(list_text_files(dir_.string()), (std::vector<std::string>{(dir_ / "a").string(), (dir_ / "b").string()}));
  EXPECT_EQ(read_documents(dir_.string()), (std::vector<std::string>{"alpha", "beta one", "beta two"}));

  // The mapped corpus gives the same documents as views into the files, also after its
  // pages were given back, and also for a file with a byte-order mark and an empty file.
  write("c", "\xEF\xBB\xBFgamma\n%\n");
  write("d", "");
  const MappedCorpus mapped(dir_.string());
  const std::vector<std::string> expected{"alpha", "beta one", "beta two", "gamma"};
  EXPECT_EQ(read_documents(dir_.string()), expected);
  ASSERT_EQ(mapped.documents().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    mapped.release(mapped.documents()[i]);
    EXPECT_EQ(std::string(mapped.documents()[i]), expected[i]);
  }
  const MappedCorpus stories(kText + "tinystories_sample.txt");
  const auto copied = read_documents(kText + "tinystories_sample.txt");
  ASSERT_EQ(stories.documents().size(), copied.size());
  for (size_t i = 0; i < copied.size(); ++i) EXPECT_EQ(std::string(stories.documents()[i]), copied[i]);
  // A file of 1 MiB and more is mapped: its documents equal read_documents' after every
  // document's pages were given back (the text around them included).
  std::string big;
  for (int d = 0; big.size() < (size_t(3) << 20); ++d)
    big += "document " + std::to_string(d) + "\n" + std::string(size_t(1000 + 37 * (d % 50)), char('a' + d % 26)) + "\n<|endoftext|>";
  write("big.txt", big);
  const MappedCorpus big_mapped((dir_ / "big.txt").string());
  const auto big_copied = read_documents((dir_ / "big.txt").string());
  ASSERT_GT(big_copied.size(), 1000u);
  ASSERT_EQ(big_mapped.documents().size(), big_copied.size());
  for (size_t i = 0; i < big_copied.size(); ++i) big_mapped.release(big_mapped.documents()[i]);
  for (size_t i = 0; i < big_copied.size(); ++i) EXPECT_EQ(std::string(big_mapped.documents()[i]), big_copied[i]);
  expect_error([&] { MappedCorpus((dir_ / "nope").string()); }, {"[read_documents]", "nope: no such file"});

  expect_error([&] { read_documents((dir_ / "nope").string()); }, {"[read_documents]", "nope: no such file"});
  fs::create_directories(dir_ / "empty");
  expect_error([&] { read_documents((dir_ / "empty").string()); }, {"empty: the directory has no text files"});
  expect_error([&] { split_documents("x", DocumentSplit::literal("")); }, {"the literal separator is empty"});
}

TEST(Documents, DebianFortunes) {
  const std::string dir = "/usr/share/games/fortunes";
  if (!fs::is_directory(dir)) GTEST_SKIP() << dir << " is not installed";
  const auto docs = read_documents(dir);
  std::cout << "  " << docs.size() << " fortunes from " << list_text_files(dir).size() << " files\n";
  // Counted independently with Python's re.split on the same files (Debian fortunes-min + fortunes).
  if (list_text_files(dir).size() == 43) {
    EXPECT_EQ(docs.size(), 15217u);
  }
  EXPECT_GT(docs.size(), 1000u);
  for (const auto& d : docs) {
    EXPECT_EQ(d.find("\n%\n"), std::string::npos);
    ASSERT_FALSE(d.empty());
  }
}

TEST(DocumentDataset, PadsAndTruncatesEachDocument) {
  const auto docs = read_documents(kText + "tinystories_sample.txt");
  DocumentDataset ds(docs, bytes, {.max_len = 700, .pad_id = 0, .bos_id = 1, .eos_id = 2});
  ASSERT_EQ(ds.size(), 5);
  // Story 2 (513 bytes) is padded: BOS, its bytes, EOS, then zeros.
  const Example short_doc = ds.get(2);
  const auto& ids = short_doc.tokens("tokens");
  ASSERT_EQ(ids.size(), 700u);
  EXPECT_EQ(short_doc.as_int("length"), 515);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(std::vector<int64_t>(ids.begin() + 1, ids.begin() + 514), bytes(docs[2]));
  EXPECT_EQ(ids[514], 2);
  for (size_t k = 515; k < 700; ++k) ASSERT_EQ(ids[k], 0);
  // Story 4 (954 bytes) is truncated and loses its EOS.
  const Example long_doc = ds.get(4);
  const auto long_bytes = bytes(docs[4]);
  EXPECT_EQ(long_doc.as_int("length"), 700);
  EXPECT_EQ(std::vector<int64_t>(long_doc.tokens("tokens").begin() + 1, long_doc.tokens("tokens").end()),
            std::vector<int64_t>(long_bytes.begin(), long_bytes.begin() + 699));
  EXPECT_EQ(ds.document(3), docs[3]);
  expect_error([&] { ds.get(5); }, {"[DocumentDataset] index 5 out of range for a dataset of 5 examples"});
  expect_error([&] { DocumentDataset(docs, nullptr, {.max_len = 8}); }, {"the tokenizer function is empty"});
  expect_error([&] { DocumentDataset(docs, bytes, {.max_len = 0}); }, {"max_len must be positive"});
}

TEST(PackedDataset, TinyShakespeareSequencesOverlapByOneToken) {
  const auto docs = read_documents(kText + "tinyshakespeare.txt");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].size(), 1115393u);  // the final newline is trimmed
  const int64_t seq_len = 256;
  PackedDataset ds(docs, bytes, {.seq_len = seq_len});
  const auto stream = bytes(docs[0]);
  EXPECT_EQ(ds.num_tokens(), int64_t(stream.size()));
  EXPECT_EQ(ds.size(), (int64_t(stream.size()) - 1) / seq_len);
  for (int64_t i : {int64_t(0), int64_t(1), ds.size() / 2, ds.size() - 1}) {
    const Example ex = ds.get(i);  // tokens() refers into the example: keep it alive
    const auto& t = ex.tokens("tokens");
    ASSERT_EQ(int64_t(t.size()), seq_len + 1);
    EXPECT_EQ(t, std::vector<int64_t>(stream.begin() + i * seq_len, stream.begin() + i * seq_len + seq_len + 1)) << i;
  }
  // Consecutive sequences share their boundary token: targets cover every token once.
  EXPECT_EQ(ds.get(0).tokens("tokens").back(), ds.get(1).tokens("tokens").front());
  expect_error([&] { ds.get(ds.size()); }, {"[PackedDataset] index", "out of range"});
}

TEST(PackedDataset, SeparatorBetweenDocuments) {
  const auto docs = read_documents(kText + "tinystories_sample.txt");
  const int64_t sep = 300;  // outside the byte range
  PackedDataset ds(docs, bytes, {.seq_len = 100, .separator_id = sep});
  std::vector<int64_t> expected;
  for (size_t d = 0; d < docs.size(); ++d) {
    if (d > 0) expected.push_back(sep);
    const auto ids = bytes(docs[d]);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  ASSERT_EQ(ds.num_tokens(), int64_t(expected.size()));  // 3717 bytes + 4 separators
  EXPECT_EQ(ds.num_tokens(), 3721);
  std::vector<int64_t> rebuilt;
  for (int64_t i = 0; i < ds.size(); ++i) {
    const Example ex = ds.get(i);
    const auto& t = ex.tokens("tokens");
    rebuilt.insert(rebuilt.end(), t.begin() + (i == 0 ? 0 : 1), t.end());
  }
  EXPECT_EQ(rebuilt, std::vector<int64_t>(expected.begin(), expected.begin() + ds.size() * 100 + 1));
  // Empty token lists add no separators; a stream can also be packed directly.
  PackedDataset direct(expected, 100);
  EXPECT_EQ(direct.get(7), ds.get(7));
  expect_error([&] { PackedDataset(docs, bytes, {.seq_len = 4000}); },
               {"[PackedDataset] the corpus has 3717 tokens, fewer than seq_len + 1 = 4001"});
  expect_error([&] { PackedDataset(std::vector<int64_t>{1, -2, 3}, 1); }, {"token id -2 (position 1)"});
}

}  // namespace
}  // namespace mt::data
