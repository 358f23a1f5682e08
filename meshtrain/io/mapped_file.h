#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mt::io {

// A whole file mapped into memory, copy-on-write: Arrays may alias its pages (no copy of
// the file) and an in-place update of such an Array changes only this process's copy.
// Shared ownership keeps the mapping alive while any aliasing Array exists.
class MappedFile {
 public:
  // Throws mt::Error "[op] <path>: ..." if the file is missing, not a regular file or
  // cannot be mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path, const char* op = "mmap");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  uint8_t* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool contains(const void* p) const {
    auto* b = static_cast<const uint8_t*>(p);
    return data_ != nullptr && b >= data_ && b < data_ + size_;
  }

 private:
  MappedFile() = default;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Writes a file atomically: bytes go to a temp file in the destination's directory, and
// commit() fsyncs it and renames it over `path`, so readers see the old or the new file,
// never a partial one. Without commit() the temp file is removed.
class AtomicFileWriter {
 public:
  AtomicFileWriter(const std::string& path, const char* op);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t n);
  void commit();
  size_t bytes_written() const { return written_; }

 private:
  std::string path_, tmp_path_, op_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

// Flushes a directory's entries (a rename in it survives a crash). Best effort: a file system
// that cannot sync a directory keeps the renames as the kernel ordered them.
void sync_directory(const std::string& dir);

// Convenience: the whole of `contents` written atomically.
void write_file_atomic(const std::string& path, const std::string& contents, const char* op = "write");

// File size in bytes, or -1 if it does not exist.
int64_t file_size_or_negative(const std::string& path);

}  // namespace mt::io
