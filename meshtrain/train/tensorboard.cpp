#include "meshtrain/train/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/train/crc32c.h"
#include "meshtrain/train/host_name.h"

namespace mt::train {

namespace {

// Protobuf wire format: a key is (field_number << 3) | wire_type.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  out += char(uint8_t(v));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t(field) << 3) | type); }

template <class T>
void put_fixed(std::string& out, T v) {
  // Fixed-width fields are little-endian, like the hosts we build for.
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event { double wall_time = 1; int64 step = 2; oneof { string file_version = 3;
// Summary summary = 5; } }
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_fixed<double>(e, wall_time);
  put_key(e, 2, kVarint);
  put_varint(e, uint64_t(step));  // int64 negatives take 10 bytes, as protobuf encodes them
  return e;
}

// Summary.Value { string tag = 1; float simple_value = 2; }
std::string summary_value(const std::string& tag, double value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_fixed<float>(v, float(value));
  return v;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  MT_CHECK(!ec, "[TensorBoardWriter] cannot create log dir '", log_dir, "': ", ec.message());
  std::string base = (std::filesystem::path(log_dir) /
                      ("events.out.tfevents." + std::to_string(std::time(nullptr)) + "." + host_name()))
                         .string();
  // "x" (exclusive create) so two writers never share a file; TensorBoard reads every
  // file whose name contains "tfevents".
  for (int n = 0; n < 1000 && !file_; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(getpid()) + "." + std::to_string(n);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && errno != EEXIST) break;
  }
  MT_CHECK(file_ != nullptr, "[TensorBoardWriter] cannot create '", path_, "': ", std::strerror(errno));
  std::string e = event_header(now_seconds(), 0);
  put_bytes(e, 3, "brain.Event:2");
  write_event(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_event(const std::string& event_bytes) {
  // TFRecord: uint64 length, masked CRC of those 8 bytes, data, masked CRC of the data.
  std::string rec;
  uint64_t len = event_bytes.size();
  put_fixed<uint64_t>(rec, len);
  put_fixed<uint32_t>(rec, masked_crc32c(rec.data(), 8));
  rec += event_bytes;
  put_fixed<uint32_t>(rec, masked_crc32c(event_bytes.data(), event_bytes.size()));
  MT_CHECK(std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size(), "[TensorBoardWriter] write to '", path_,
           "' failed: ", std::strerror(errno));
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string summary;
  put_bytes(summary, 1, summary_value(tag, value));
  std::string e = event_header(now_seconds(), step);
  put_bytes(e, 5, summary);
  std::lock_guard<std::mutex> lock(mu_);
  write_event(e);
}

void TensorBoardWriter::write(const ScalarRecord& record) {
  std::string summary;
  for (const auto& [name, value] : record.values) put_bytes(summary, 1, summary_value(record.split + "/" + name, value));
  std::string e = event_header(now_seconds(), record.step);
  put_bytes(e, 5, summary);
  std::lock_guard<std::mutex> lock(mu_);
  write_event(e);
}

void TensorBoardWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  MT_CHECK(std::fflush(file_) == 0, "[TensorBoardWriter] flush of '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace mt::train
