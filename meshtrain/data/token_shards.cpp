#include "meshtrain/data/token_shards.h"

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/mapped_file.h"  // write_file_atomic

namespace mt::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kFormat = "meshtrain-token-shards";
}

TokenShardWriter::TokenShardWriter(std::string dir, std::string prefix, int64_t vocab_size, int64_t shard_tokens)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), vocab_size_(vocab_size), shard_tokens_(shard_tokens),
      bytes_(id_bytes(vocab_size)) {
  MT_CHECK(vocab_size_ > 0 && vocab_size_ <= (int64_t(1) << 32), "[prepare-data] vocabulary of ", vocab_size_, " ids");
  MT_CHECK(shard_tokens_ > 0, "[prepare-data] shard size must be positive, got ", shard_tokens_);
  fs::create_directories(dir_);
}

TokenShardWriter::~TokenShardWriter() = default;  // an uncommitted shard's temp file is removed

void TokenShardWriter::add(const std::vector<int64_t>& tokens) {
  constexpr size_t kBufferBytes = size_t(1) << 20;
  for (int64_t t : tokens) {
    MT_CHECK(t >= 0 && t < vocab_size_, "[prepare-data] token id ", t, " outside the vocabulary of ", vocab_size_);
    if (!shard_) {
      char name[96];
      std::snprintf(name, sizeof name, "%s_%05zu.bin", prefix_.c_str(), written_.size());
      shard_name_ = name;
      shard_ = std::make_unique<io::AtomicFileWriter>((fs::path(dir_) / shard_name_).string(), "prepare-data");
      shard_count_ = 0;
    }
    const uint32_t v = uint32_t(t);
    for (int b = 0; b < bytes_; ++b) buffer_.push_back(char((v >> (8 * b)) & 0xff));  // little-endian
    if (buffer_.size() >= kBufferBytes) write_buffer();
    if (++shard_count_ == shard_tokens_) close_shard();
  }
}

void TokenShardWriter::write_buffer() {
  if (!buffer_.empty()) shard_->write(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void TokenShardWriter::close_shard() {
  if (!shard_) return;
  write_buffer();
  shard_->commit();
  shard_.reset();
  written_.emplace_back(shard_name_, shard_count_);
}

std::vector<std::pair<std::string, int64_t>> TokenShardWriter::finish() {
  close_shard();
  return written_;
}

void write_token_shard_index(const std::string& dir, int64_t vocab_size, std::optional<int64_t> separator_id,
                             const std::vector<std::pair<std::string, int64_t>>& shards, const std::string& source) {
  json list = json::array();
  int64_t total = 0;
  for (const auto& [file, tokens] : shards) list.push_back({{"file", file}, {"tokens", tokens}}), total += tokens;
  json index = {{"format", kFormat},
                {"version", 1},
                {"dtype", TokenShardWriter::id_bytes(vocab_size) == 2 ? "uint16" : "uint32"},
                {"vocab_size", vocab_size},
                {"separator_id", separator_id ? json(*separator_id) : json()},
                {"num_tokens", total},
                {"source", source},
                {"shards", list}};
  io::write_file_atomic((fs::path(dir) / "index.json").string(), index.dump(2) + "\n", "prepare-data");
}

bool is_token_shard_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "index.json", ec);
}

TokenShardDataset::TokenShardDataset(const std::string& dir, int64_t seq_len) : seq_len_(seq_len) {
  const std::string index_path = (fs::path(dir) / "index.json").string();
  const json index = io::read_json_file(index_path);
  auto field = [&](const char* key) -> const json& {
    MT_CHECK(index.is_object() && index.contains(key), "[token shards] ", index_path, ": missing key '", key, "'");
    return index[key];
  };
  MT_CHECK(field("format") == kFormat, "[token shards] ", index_path, ": format ", field("format").dump(),
           ", expected \"", kFormat, "\"");
  const std::string dtype = field("dtype").is_string() ? field("dtype").get<std::string>() : "";
  MT_CHECK(dtype == "uint16" || dtype == "uint32", "[token shards] ", index_path, ": dtype ", field("dtype").dump(),
           " (uint16 or uint32)");
  id_bytes_ = dtype == "uint16" ? 2 : 4;
  MT_CHECK(field("vocab_size").is_number_integer(), "[token shards] ", index_path, ": vocab_size must be an integer");
  vocab_size_ = field("vocab_size").get<int64_t>();
  if (!field("separator_id").is_null()) separator_id_ = field("separator_id").get<int64_t>();
  MT_CHECK(field("shards").is_array() && !field("shards").empty(), "[token shards] ", index_path, ": no shards");
  for (const json& s : field("shards")) {
    MT_CHECK(s.is_object() && s.contains("file") && s["file"].is_string() && s.contains("tokens") &&
                 s["tokens"].is_number_integer(),
             "[token shards] ", index_path, ": a shard entry needs \"file\" and \"tokens\": ", s.dump());
    const std::string file = s["file"].get<std::string>();
    MT_CHECK(file.find('/') == std::string::npos, "[token shards] ", index_path, ": shard '", file,
             "' must be a file name in the directory");
    const std::string path = (fs::path(dir) / file).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MT_CHECK(fd >= 0, "[token shards] ", path, ": cannot open: ", std::strerror(errno));
    fds_.push_back(fd);
    paths_.push_back(path);
    std::error_code ec;
    const auto bytes = fs::file_size(path, ec);
    const int64_t tokens = s["tokens"].get<int64_t>();
    MT_CHECK(!ec && int64_t(bytes) == tokens * id_bytes_, "[token shards] ", path, ": ", int64_t(bytes),
             " bytes, but index.json says ", tokens, " ", dtype, " tokens (", tokens * id_bytes_, " bytes)");
    starts_.push_back(num_tokens_);
    num_tokens_ += tokens;
  }
  MT_CHECK(seq_len_ > 0, "[token shards] sequence length must be positive, got ", seq_len_);
  num_sequences_ = num_tokens_ > seq_len_ ? (num_tokens_ - 1) / seq_len_ : 0;
  MT_CHECK(num_sequences_ > 0, "[token shards] ", dir, ": ", num_tokens_, " tokens make no sequence of ", seq_len_ + 1);
}

TokenShardDataset::~TokenShardDataset() {
  for (int fd : fds_) ::close(fd);
}

std::vector<int64_t> TokenShardDataset::read(int64_t position, int64_t n) const {
  MT_CHECK(position >= 0 && n >= 0 && position + n <= num_tokens_, "[token shards] tokens [", position, ", ",
           position + n, ") outside ", num_tokens_);
  std::vector<int64_t> out;
  out.reserve(size_t(n));
  std::vector<uint8_t> buf;
  while (n > 0) {
    const size_t shard = size_t(std::upper_bound(starts_.begin(), starts_.end(), position) - starts_.begin()) - 1;
    const int64_t end = shard + 1 < starts_.size() ? starts_[shard + 1] : num_tokens_;
    const int64_t take = std::min(n, end - position);
    buf.resize(size_t(take * id_bytes_));
    const off_t offset = off_t((position - starts_[shard]) * id_bytes_);
    size_t got = 0;
    while (got < buf.size()) {
      const ssize_t r = ::pread(fds_[shard], buf.data() + got, buf.size() - got, offset + off_t(got));
      MT_CHECK(r > 0, "[token shards] ", paths_[shard], ": read failed at byte ", offset + off_t(got), ": ",
               r == 0 ? "end of file (the shard shrank?)" : std::strerror(errno));
      got += size_t(r);
    }
    for (int64_t i = 0; i < take; ++i) {
      uint32_t v = 0;
      for (int b = 0; b < id_bytes_; ++b) v |= uint32_t(buf[size_t(i * id_bytes_ + b)]) << (8 * b);
      out.push_back(int64_t(v));
    }
    position += take;
    n -= take;
  }
  return out;
}

int64_t TokenShardDataset::token(int64_t position) const { return read(position, 1)[0]; }

Example TokenShardDataset::get(int64_t index) const {
  MT_CHECK(index >= 0 && index < num_sequences_, "[token shards] sequence ", index, " outside [0, ", num_sequences_, ")");
  std::vector<int64_t> tokens = read(index * seq_len_, seq_len_ + 1);
  for (int64_t i = 0; i <= seq_len_; ++i)
    MT_CHECK(tokens[size_t(i)] < vocab_size_, "[token shards] token ", tokens[size_t(i)], " at position ",
             index * seq_len_ + i, " is outside the vocabulary of ", vocab_size_, " (a corrupt shard?)");
  return Example{{"tokens", tokens}};
}

}  // namespace mt::data
