// TensorBoard event files: CRC-32C against published vectors, the exact bytes of an Event,
// and a reader that checks the TFRecord framing and both CRCs and decodes what was written.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "meshtrain/meshtrain.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test under the system temp dir.
fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mt_tb_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

using mt::testing::error_of;

TEST(Crc32c, KnownVectors) {
  // The check value of CRC-32C and the iSCSI test vectors of RFC 3720, B.4.
  std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, 0), dec(32, 0);
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = char(i), dec[size_t(i)] = char(31 - i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c("", 0), 0u);
  // Continuing over a split buffer equals one pass.
  EXPECT_EQ(crc32c(digits.data() + 4, 5, crc32c(digits.data(), 4)), 0xE3069283u);
  // TFRecord's mask: rotate right 15, add 0xa282ead8.
  uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c(digits.data(), digits.size()), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, EventBytesFollowTheProtobufWireFormat) {
  fs::path dir = temp_dir("bytes");
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    w.scalar("loss", 0.5, 3);
  }
  std::string bytes = read_bytes(path);
  // Skip the version record: 8 + 4 + len + 4 bytes.
  uint64_t len0;
  std::memcpy(&len0, bytes.data(), 8);
  size_t pos = 12 + len0 + 4;
  uint64_t len;
  std::memcpy(&len, bytes.data() + pos, 8);
  std::string data = bytes.substr(pos + 12, len);
  ASSERT_EQ(len, 26u);
  EXPECT_EQ(uint8_t(data[0]), 0x09);  // wall_time: field 1, fixed64
  std::string rest = data.substr(9);
  // step: field 2 varint 3; summary: field 5, 13 bytes -> value: field 1, 11 bytes ->
  // tag: field 1 "loss"; simple_value: field 2 fixed32 0.5f (0x3f000000 little-endian).
  const std::string expected("\x10\x03\x2a\x0d\x0a\x0b\x0a\x04loss\x15\x00\x00\x00\x3f", 17);
  EXPECT_EQ(rest, expected);
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + pos + 12 + len, 4);
  EXPECT_EQ(crc, masked_crc32c(data.data(), data.size()));
  EXPECT_EQ(pos + 12 + len + 4, bytes.size());
  fs::remove_all(dir);
}

TEST(TensorBoard, ScalarsRoundTripThroughTheReader) {
  fs::path dir = temp_dir("roundtrip");
  std::string path;
  double before = double(std::time(nullptr)) - 1;
  {
    TensorBoardWriter w((dir / "nested" / "run").string());
    path = w.path();
    EXPECT_EQ(fs::path(path).parent_path(), dir / "nested" / "run");
    std::string name = fs::path(path).filename().string();
    EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
    for (int64_t s = 0; s < 50; ++s) w.scalar("train/loss", 3.0 / double(s + 1), s);
    w.scalar("big_step", -1.25, int64_t(1) << 40);
    w.scalar("negative_step", 7, -5);
    w.flush();
    // Flushed data is readable while the writer is still open.
    EXPECT_EQ(read_tensorboard_events(path).size(), 53u);
    w.write(ScalarRecord{60, "eval", {{"accuracy", 0.875}, {"f1", 0.9}}});
  }
  auto events = read_tensorboard_events(path);
  ASSERT_EQ(events.size(), 54u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].scalars.empty());
  EXPECT_GE(events[0].wall_time, before);
  for (int64_t s = 0; s < 50; ++s) {
    const auto& e = events[size_t(s + 1)];
    EXPECT_EQ(e.step, s);
    ASSERT_EQ(e.scalars.size(), 1u);
    EXPECT_EQ(e.scalars[0].first, "train/loss");
    EXPECT_EQ(e.scalars[0].second, float(3.0 / double(s + 1)));
    EXPECT_GE(e.wall_time, events[0].wall_time);
  }
  EXPECT_EQ(events[51].step, int64_t(1) << 40);
  EXPECT_EQ(events[51].scalars[0].second, -1.25f);
  EXPECT_EQ(events[52].step, -5);
  EXPECT_EQ(events[53].step, 60);
  ASSERT_EQ(events[53].scalars.size(), 2u);
  EXPECT_EQ(events[53].scalars[0], (std::pair<std::string, float>("eval/accuracy", 0.875f)));
  EXPECT_EQ(events[53].scalars[1], (std::pair<std::string, float>("eval/f1", 0.9f)));
  fs::remove_all(dir);
}

TEST(TensorBoard, TwoWritersInOneDirGetSeparateFiles) {
  fs::path dir = temp_dir("two");
  TensorBoardWriter a(dir.string()), b(dir.string());
  EXPECT_NE(a.path(), b.path());
  a.scalar("x", 1, 1);
  b.scalar("x", 2, 1);
  a.flush();
  b.flush();
  EXPECT_EQ(read_tensorboard_events(a.path()).back().scalars[0].second, 1.0f);
  EXPECT_EQ(read_tensorboard_events(b.path()).back().scalars[0].second, 2.0f);
  fs::remove_all(dir);
}

TEST(TensorBoard, ReaderRejectsCorruptFiles) {
  fs::path dir = temp_dir("corrupt");
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    w.scalar("loss", 1.0, 1);
  }
  const std::string good = read_bytes(path);
  uint64_t len0;
  std::memcpy(&len0, good.data(), 8);
  size_t second = 12 + len0 + 4;

  std::string bad = good;
  bad[second + 12 + 5] ^= 0x01;  // a wall_time byte of the second record
  write_bytes(path, bad);
  EXPECT_EQ(error_of([&] { read_tensorboard_events(path); }),
            "[read_tensorboard_events] " + path + ": data CRC mismatch in the record at byte " + std::to_string(second));

  bad = good;
  bad[second] ^= 0x01;  // its length
  write_bytes(path, bad);
  EXPECT_EQ(error_of([&] { read_tensorboard_events(path); }),
            "[read_tensorboard_events] " + path + ": length CRC mismatch in the record at byte " + std::to_string(second));

  write_bytes(path, good.substr(0, good.size() - 3));
  EXPECT_NE(error_of([&] { read_tensorboard_events(path); }).find("claims 26 data bytes but the file ends first"),
            std::string::npos);
  write_bytes(path, good.substr(0, second + 5));
  EXPECT_NE(error_of([&] { read_tensorboard_events(path); }).find("truncated record header"), std::string::npos);
  EXPECT_EQ(error_of([&] { read_tensorboard_events((dir / "missing").string()); }),
            "[read_tensorboard_events] cannot open '" + (dir / "missing").string() + "'");
  fs::remove_all(dir);
}

TEST(TensorBoard, UnusableLogDirIsAnError) {
  fs::path dir = temp_dir("blocked");
  fs::create_directories(dir);
  write_bytes((dir / "file").string(), "x");  // a file where the log dir should be
  std::string msg = error_of([&] { TensorBoardWriter w((dir / "file" / "logs").string()); });
  EXPECT_EQ(msg.rfind("[TensorBoardWriter] cannot create log dir '" + (dir / "file" / "logs").string() + "'", 0), 0u)
      << msg;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt::train
