#pragma once
// Corpora tokenized once into memory-mapped token shards (in the style of nanoGPT / llm.c
// `.bin` files): `shard_*.bin` files of little-endian uint16 ids (uint32 when the vocabulary
// needs them) and an `index.json` naming the shards in order, with their token counts, the
// id type, the vocabulary size and the separator id between documents. The files can be
// memory-mapped by other tools (nanoGPT / llm.c style); meshtrain reads each sequence with
// pread(): on kernels whose page cache holds large folios a mapped read pins the whole folio
// in the process (about 410 KB resident per random 258-byte read, measured here), so RSS would
// grow with the corpus, while pread leaves the pages to the kernel's cache.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/data/dataset.h"

namespace mt::io {
class AtomicFileWriter;
}

namespace mt::data {

// Writes one process's tokens as shards `<prefix>_<n>.bin` of at most `shard_tokens` ids.
// Ids stream into the open shard's temp file through a 1 MiB buffer, so memory stays the same
// whatever the corpus and shard size; a shard appears under its name (atomically) once full
// or at finish(), and a writer dropped before that leaves no partial shard.
class TokenShardWriter {
 public:
  TokenShardWriter(std::string dir, std::string prefix, int64_t vocab_size, int64_t shard_tokens);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;
  void add(const std::vector<int64_t>& tokens);
  // Closes the last shard; the shards written, in order, with their token counts.
  std::vector<std::pair<std::string, int64_t>> finish();
  static int id_bytes(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

 private:
  void write_buffer();
  void close_shard();
  std::string dir_, prefix_;
  int64_t vocab_size_, shard_tokens_;
  int bytes_;                                   // per id
  std::unique_ptr<io::AtomicFileWriter> shard_;  // the shard being filled, if any
  std::string shard_name_;
  int64_t shard_count_ = 0;                     // ids in the open shard
  std::string buffer_;                          // encoded ids not yet written
  std::vector<std::pair<std::string, int64_t>> written_;
};

// index.json of a shard directory, written atomically once every shard is in place.
void write_token_shard_index(const std::string& dir, int64_t vocab_size, std::optional<int64_t> separator_id,
                             const std::vector<std::pair<std::string, int64_t>>& shards, const std::string& source);

bool is_token_shard_dir(const std::string& path);  // a directory with index.json

// The shards as one token stream cut like PackedDataset: sequence i holds tokens
// [i*seq_len, i*seq_len + seq_len] ({"tokens": seq_len + 1 ids}).
class TokenShardDataset final : public Dataset {
 public:
  // Throws mt::Error naming the directory, file and field for a missing or malformed index,
  // a missing shard, or a shard whose size disagrees with the index.
  TokenShardDataset(const std::string& dir, int64_t seq_len);
  ~TokenShardDataset() override;
  TokenShardDataset(const TokenShardDataset&) = delete;
  TokenShardDataset& operator=(const TokenShardDataset&) = delete;
  int64_t size() const override { return num_sequences_; }
  Example get(int64_t index) const override;
  int64_t num_tokens() const { return num_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }
  std::optional<int64_t> separator_id() const { return separator_id_; }
  int64_t token(int64_t position) const;  // the id at a position of the whole stream

 private:
  // Ids [position, position + n) of the stream, read from the shards.
  std::vector<int64_t> read(int64_t position, int64_t n) const;
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  std::vector<int64_t> starts_;  // first stream position of each shard
  int id_bytes_ = 2;
  int64_t num_tokens_ = 0, vocab_size_ = 0, seq_len_ = 0, num_sequences_ = 0;
  std::optional<int64_t> separator_id_;
};

}  // namespace mt::data
