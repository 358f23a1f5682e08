#include "apps/meshtrain/glue_token_cache.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"

namespace mt::cli {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'M', 'T', 'G', 'L', 'U', 'E', 'T', '1'};

// FNV-1a, 64-bit: a fingerprint, not a defence against a chosen collision.
struct Fingerprint {
  uint64_t h = 1469598103934665603ull;
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  void add(const std::string& s) {
    const uint64_t n = s.size();
    add(&n, sizeof n);
    add(s.data(), s.size());
  }
};

// The rows' tokens, flat: n × max_len each.
class PretokenizedDataset final : public data::Dataset {
 public:
  PretokenizedDataset(std::shared_ptr<const data::Dataset> rows, int64_t max_len, std::vector<int32_t> ids,
                      std::vector<uint8_t> types, std::vector<uint8_t> mask)
      : rows_(std::move(rows)), len_(max_len), ids_(std::move(ids)), types_(std::move(types)), mask_(std::move(mask)) {}
  int64_t size() const override { return rows_->size(); }
  data::Example get(int64_t i) const override {
    data::Example e = rows_->get(i);
    const size_t at = size_t(i * len_);
    e.set("input_ids", std::vector<int64_t>(ids_.begin() + long(at), ids_.begin() + long(at + size_t(len_))));
    e.set("token_type_ids", std::vector<int64_t>(types_.begin() + long(at), types_.begin() + long(at + size_t(len_))));
    e.set("attention_mask", std::vector<int64_t>(mask_.begin() + long(at), mask_.begin() + long(at + size_t(len_))));
    return e;
  }

 private:
  std::shared_ptr<const data::Dataset> rows_;
  int64_t len_;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> types_, mask_;
};

struct Tokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> types, mask;
};

Tokens tokenize_all(const data::Dataset& rows, const tokenizers::Tokenizer& tok, bool pairs, int64_t max_len) {
  Tokens t;
  const int64_t n = rows.size();
  t.ids.reserve(size_t(n * max_len)), t.types.reserve(size_t(n * max_len)), t.mask.reserve(size_t(n * max_len));
  // Chunks keep the Encodings (a few vectors per row) from all existing at once.
  constexpr int64_t kChunk = 8192;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = std::min(n, start + kChunk);
    std::vector<tokenizers::Encoding> enc;
    if (pairs) {
      std::vector<std::pair<std::string, std::string>> texts;
      for (int64_t i = start; i < end; ++i) {
        const data::Example e = rows.get(i);
        texts.emplace_back(e.str("text_a"), e.str("text_b"));
      }
      enc = tok.encode_batch(texts);
    } else {
      std::vector<std::string> texts;
      for (int64_t i = start; i < end; ++i) texts.push_back(rows.get(i).str("text_a"));
      enc = tok.encode_batch(texts);
    }
    for (const tokenizers::Encoding& e : enc) {
      MT_CHECK(int64_t(e.ids.size()) == max_len, "[glue] an encoding of ", e.ids.size(), " tokens, not ", max_len);
      t.ids.insert(t.ids.end(), e.ids.begin(), e.ids.end());
      for (size_t k = 0; k < e.ids.size(); ++k) {
        t.types.push_back(uint8_t(e.type_ids[k]));
        t.mask.push_back(uint8_t(e.attention_mask[k]));
      }
    }
  }
  return t;
}

std::string key_of(const data::Dataset& rows, const std::string& tokenizer_dir, bool pairs, int64_t max_len) {
  Fingerprint f;
  f.add(kMagic, sizeof kMagic);
  f.add(&max_len, sizeof max_len);
  const uint8_t p = pairs;
  f.add(&p, 1);
  for (int64_t i = 0; i < rows.size(); ++i) {
    const data::Example e = rows.get(i);
    f.add(e.str("text_a"));
    if (pairs) f.add(e.str("text_b"));
  }
  // The tokenizer's files, in name order.
  std::vector<fs::path> files;
  if (fs::is_directory(tokenizer_dir))
    for (const auto& entry : fs::directory_iterator(tokenizer_dir)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && (name.find("token") != std::string::npos || name.find("vocab") != std::string::npos ||
                                      name.find("merges") != std::string::npos || name.find("spiece") != std::string::npos ||
                                      name.find("special") != std::string::npos))
        files.push_back(entry.path());
    }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    f.add(file.filename().string());
    f.add(std::string((std::istreambuf_iterator<char>(in)), {}));
  }
  std::ostringstream hex;
  hex << std::hex << std::setw(16) << std::setfill('0') << f.h;
  return hex.str();
}

bool read_cache(const fs::path& path, int64_t n, int64_t max_len, Tokens& t) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[8];
  int64_t rows = 0, len = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&rows), 8);
  in.read(reinterpret_cast<char*>(&len), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0 || rows != n || len != max_len) return false;
  const size_t cells = size_t(n * max_len);
  t.ids.resize(cells), t.types.resize(cells), t.mask.resize(cells);
  in.read(reinterpret_cast<char*>(t.ids.data()), std::streamsize(cells * sizeof(int32_t)));
  in.read(reinterpret_cast<char*>(t.types.data()), std::streamsize(cells));
  in.read(reinterpret_cast<char*>(t.mask.data()), std::streamsize(cells));
  return bool(in);
}

bool write_cache(const fs::path& path, int64_t n, int64_t max_len, const Tokens& t) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return false;
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(reinterpret_cast<const char*>(&max_len), 8);
    out.write(reinterpret_cast<const char*>(t.ids.data()), std::streamsize(t.ids.size() * sizeof(int32_t)));
    out.write(reinterpret_cast<const char*>(t.types.data()), std::streamsize(t.types.size()));
    out.write(reinterpret_cast<const char*>(t.mask.data()), std::streamsize(t.mask.size()));
    if (!out) {
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

}  // namespace

std::string token_cache_dir(const std::string& data_dir) {
  const fs::path dir = data_dir.empty() ? fs::current_path() : fs::path(data_dir);
  std::error_code ec;
  const fs::perms p = fs::status(dir, ec).permissions();
  const bool writable = !ec && (p & (fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write)) != fs::perms::none &&
                        ::access(dir.c_str(), W_OK) == 0;
  if (writable) return (dir / ".meshtrain_cache").string();
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  return (base / "meshtrain" / "glue-tokens").string();
}

std::shared_ptr<const data::Dataset> pretokenize_glue(std::shared_ptr<const data::Dataset> rows, const tokenizers::Tokenizer& tok,
                                                      const data::GlueTask& task, int64_t max_len,
                                                      const std::string& tokenizer_dir, const std::string& cache_dir,
                                                      const std::string& name, TokenCacheReport* report) {
  MT_CHECK(tok.truncation() && tok.padding() && tok.padding()->length == size_t(max_len),
           "[glue] the tokenizer must truncate and pad to ", max_len);
  const auto start = std::chrono::steady_clock::now();
  const bool pairs = !task.text_b.empty();
  const int64_t n = rows->size();
  TokenCacheReport r;
  Tokens t;
  dist::Communicator& world = dist::world();
  if (!cache_dir.empty()) {
    const fs::path path = fs::path(cache_dir) / (name + "-" + std::to_string(max_len) + "-" +
                                                 key_of(*rows, tokenizer_dir, pairs, max_len) + ".tokens");
    r.path = path.string();
    // Rank 0 makes the file when it is missing; the others read what it made.
    int32_t ok = 1;
    if (world.rank() == 0 && !read_cache(path, n, max_len, t)) {
      t = tokenize_all(*rows, tok, pairs, max_len);
      ok = write_cache(path, n, max_len, t) ? 1 : 0;
    } else if (world.rank() == 0) {
      r.from_cache = true;
    }
    if (world.size() > 1) world.broadcast(&ok, 1, DType::i32, 0);
    if (!ok) r.path.clear();
    if (world.rank() != 0) {
      if (!ok || !read_cache(path, n, max_len, t)) t = tokenize_all(*rows, tok, pairs, max_len);
    }
    int32_t hit = r.from_cache ? 1 : 0;
    if (world.size() > 1) world.broadcast(&hit, 1, DType::i32, 0);
    r.from_cache = hit != 0;
  } else {
    t = tokenize_all(*rows, tok, pairs, max_len);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (report) *report = r;
  return std::make_shared<PretokenizedDataset>(std::move(rows), max_len, std::move(t.ids), std::move(t.types), std::move(t.mask));
}

}  // namespace mt::cli
