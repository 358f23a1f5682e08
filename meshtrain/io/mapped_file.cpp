#include "meshtrain/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "meshtrain/core/error.h"

namespace mt::io {

namespace {
std::string errno_text() { return std::strerror(errno); }

// Closes a descriptor on every exit path of open().
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};
// The process umask without umask()'s set-and-restore, which would briefly change it for
// every other thread (Linux reports it in /proc/self/status since 4.7).
mode_t current_umask() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Umask:", 0) == 0) return mode_t(std::stoul(line.substr(6), nullptr, 8));
  return 022;
}
}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path, const char* op) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, "[", op, "] ", path, ": cannot open: ", errno_text());
  FdGuard guard{fd};
  struct stat st {};
  MT_CHECK(::fstat(fd, &st) == 0, "[", op, "] ", path, ": cannot stat: ", errno_text());
  MT_CHECK(S_ISREG(st.st_mode), "[", op, "] ", path, ": not a regular file");
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = size_t(st.st_size);
  if (f->size_ == 0) return f;  // mmap rejects length 0; the format checks report it
  // PROT_WRITE with MAP_PRIVATE: writes through an aliasing Array copy the page (never
  // the file), so in-place updates of loaded weights are safe on read-only files too.
  void* p = ::mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  MT_CHECK(p != MAP_FAILED, "[", op, "] ", path, ": cannot mmap ", f->size_, " bytes: ", errno_text());
  f->data_ = static_cast<uint8_t*>(p);
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

AtomicFileWriter::AtomicFileWriter(const std::string& path, const char* op) : path_(path), op_(op) {
  MT_CHECK(!path.empty(), "[", op, "] empty output path");
  std::string tmpl = path + ".tmp.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = ::mkstemp(buf.data());
  MT_CHECK(fd_ >= 0, "[", op, "] ", path, ": cannot create a temporary file next to it: ", errno_text());
  tmp_path_ = buf.data();
  // mkstemp creates 0600; a model file should get the usual umask-derived permissions.
  ::fchmod(fd_, 0666 & ~current_umask());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t n) {
  MT_CHECK(fd_ >= 0 && !committed_, "[", op_, "] ", path_, ": write after commit");
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    MT_CHECK(w > 0, "[", op_, "] ", path_, ": write failed after ", written_, " bytes: ", errno_text());
    p += w;
    n -= size_t(w);
    written_ += size_t(w);
  }
}

void AtomicFileWriter::commit() {
  MT_CHECK(fd_ >= 0 && !committed_, "[", op_, "] ", path_, ": already committed");
  MT_CHECK(::fsync(fd_) == 0, "[", op_, "] ", path_, ": fsync failed: ", errno_text());
  int rc = ::close(fd_);
  fd_ = -1;
  MT_CHECK(rc == 0, "[", op_, "] ", path_, ": close failed: ", errno_text());
  MT_CHECK(::rename(tmp_path_.c_str(), path_.c_str()) == 0, "[", op_, "] ", path_,
           ": cannot rename the temporary file into place: ", errno_text());
  committed_ = true;
  // The rename itself is durable only once the directory entry is flushed.
  sync_directory(std::filesystem::path(path_).parent_path().string());
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& contents, const char* op) {
  AtomicFileWriter w(path, op);
  w.write(contents.data(), contents.size());
  w.commit();
}

int64_t file_size_or_negative(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return int64_t(st.st_size);
}

}  // namespace mt::io
