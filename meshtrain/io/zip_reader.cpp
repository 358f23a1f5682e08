#include "meshtrain/io/zip_reader.h"

#include <cstring>
#include <fstream>

#include "meshtrain/core/error.h"

namespace mt::io {
namespace {

constexpr uint32_t kEndOfCentralDir = 0x06054b50, kZip64Locator = 0x07064b50, kZip64End = 0x06064b50,
                   kCentralEntry = 0x02014b50, kLocalHeader = 0x04034b50;

template <class T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // zip is little-endian, as are the hosts meshtrain runs on
  return v;
}

}  // namespace

bool ZipReader::looks_like_zip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

ZipReader::ZipReader(const std::string& path) : file_(MappedFile::open(path, "zip")) {
  const uint8_t* d = file_->data();
  const uint64_t n = file_->size();
  auto fail = [&](const std::string& what) { throw Error(detail::concat("[zip] ", path, ": ", what)); };
  if (n < 22) fail("too short to be a zip archive");
  // The end-of-central-directory record: last in the file, before a comment of up to 64 KiB.
  uint64_t eocd = n;
  for (uint64_t i = n - 22 + 1; i-- > (n > 22 + 65535 ? n - 22 - 65535 : 0);)
    if (read_le<uint32_t>(d + i) == kEndOfCentralDir) {
      eocd = i;
      break;
    }
  if (eocd == n) fail("no end-of-central-directory record (not a zip archive, or truncated)");
  uint64_t count = read_le<uint16_t>(d + eocd + 10);
  uint64_t cd_size = read_le<uint32_t>(d + eocd + 12), cd_offset = read_le<uint32_t>(d + eocd + 16);
  if (eocd >= 20 && read_le<uint32_t>(d + eocd - 20) == kZip64Locator) {
    const uint64_t z = read_le<uint64_t>(d + eocd - 20 + 8);
    if (z + 56 > n || read_le<uint32_t>(d + z) != kZip64End) fail("bad zip64 end-of-central-directory record");
    count = read_le<uint64_t>(d + z + 32);
    cd_size = read_le<uint64_t>(d + z + 40);
    cd_offset = read_le<uint64_t>(d + z + 48);
  }
  if (cd_offset > n || cd_size > n - cd_offset) fail("the central directory lies outside the file");
  uint64_t at = cd_offset;
  for (uint64_t k = 0; k < count; ++k) {
    if (at + 46 > cd_offset + cd_size || read_le<uint32_t>(d + at) != kCentralEntry)
      fail(detail::concat("central directory entry ", k, " is malformed"));
    Entry e;
    e.method = read_le<uint16_t>(d + at + 10);
    e.compressed_size = read_le<uint32_t>(d + at + 20);
    e.size = read_le<uint32_t>(d + at + 24);
    const uint16_t name_len = read_le<uint16_t>(d + at + 28), extra_len = read_le<uint16_t>(d + at + 30),
                   comment_len = read_le<uint16_t>(d + at + 32);
    e.local_offset = read_le<uint32_t>(d + at + 42);
    if (at + 46 + name_len + extra_len + comment_len > cd_offset + cd_size)
      fail(detail::concat("central directory entry ", k, " runs past the directory"));
    std::string name(reinterpret_cast<const char*>(d + at + 46), name_len);
    // Zip64: the fields saturated at 0xFFFFFFFF follow in the extra field 0x0001, in order.
    for (uint64_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint16_t id = read_le<uint16_t>(d + x), len = read_le<uint16_t>(d + x + 2);
      if (id == 1) {
        uint64_t f = x + 4;
        if (e.size == 0xFFFFFFFFu && f + 8 <= x + 4 + len) e.size = read_le<uint64_t>(d + f), f += 8;
        if (e.compressed_size == 0xFFFFFFFFu && f + 8 <= x + 4 + len) e.compressed_size = read_le<uint64_t>(d + f), f += 8;
        if (e.local_offset == 0xFFFFFFFFu && f + 8 <= x + 4 + len) e.local_offset = read_le<uint64_t>(d + f);
      }
      x += 4 + len;
    }
    index_.emplace(name, names_.size());
    names_.push_back(std::move(name));
    entries_.push_back(e);
    at += 46 + name_len + extra_len + comment_len;
  }
}

std::optional<std::string_view> ZipReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return std::nullopt;
  const Entry& e = entries_[it->second];
  const uint8_t* d = file_->data();
  const uint64_t n = file_->size();
  MT_CHECK(e.method == 0, "[zip] ", path(), ": entry '", name, "' is compressed (method ", e.method,
           "); torch.save writes stored entries only");
  MT_CHECK(e.local_offset + 30 <= n && read_le<uint32_t>(d + e.local_offset) == kLocalHeader, "[zip] ", path(),
           ": entry '", name, "' has no local header at offset ", e.local_offset);
  const uint64_t data = e.local_offset + 30 + read_le<uint16_t>(d + e.local_offset + 26) +
                        read_le<uint16_t>(d + e.local_offset + 28);
  MT_CHECK(data <= n && e.size <= n - data, "[zip] ", path(), ": entry '", name, "' (", e.size,
           " bytes) runs past the end of the file (truncated?)");
  return std::string_view(reinterpret_cast<const char*>(d + data), e.size);
}

}  // namespace mt::io
