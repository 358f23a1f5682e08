#pragma once
// Reads uncompressed ("stored") entries of a zip archive in place: what torch.save writes
// (pytorch_model.bin since PyTorch 1.6). Zip64 sizes and offsets are understood; a
// compressed entry is an error naming it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "meshtrain/io/mapped_file.h"

namespace mt::io {

class ZipReader {
 public:
  // Throws mt::Error naming the file when it is not a readable zip archive.
  explicit ZipReader(const std::string& path);
  static bool looks_like_zip(const std::string& path);

  const std::vector<std::string>& names() const { return names_; }
  // An entry's bytes (aliasing the mapped file), or nullopt when absent; throws for a
  // compressed entry or one that runs past the end of the file.
  std::optional<std::string_view> find(const std::string& name) const;
  const std::string& path() const { return file_->path(); }
  const std::shared_ptr<MappedFile>& file() const { return file_; }

 private:
  struct Entry {
    uint64_t local_offset = 0, size = 0, compressed_size = 0;
    uint16_t method = 0;
  };
  std::shared_ptr<MappedFile> file_;
  std::vector<std::string> names_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> position (a checkpoint looks up every storage)
};

}  // namespace mt::io
