#include "meshtrain/train/tensorboard_reader.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "meshtrain/core/error.h"
#include "meshtrain/train/crc32c.h"

namespace mt::train {

namespace {

// A bounded cursor over protobuf bytes; every read checks the bound.
struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  const std::string& path;
  size_t record_offset;

  void need(size_t n) const {
    MT_CHECK(size_t(end - p) >= n, "[read_tensorboard_events] ", path, ": malformed Event in the record at byte ",
             record_offset, " (field runs past the end)");
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      uint8_t b = *p++;
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Error(detail::concat("[read_tensorboard_events] ", path, ": varint longer than 10 bytes in the record at byte ",
                               record_offset));
  }
  template <class T>
  T fixed() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  Cursor sub() {
    uint64_t n = varint();
    need(n);
    Cursor c{p, p + n, path, record_offset};
    p += n;
    return c;
  }
  std::string str() {
    Cursor c = sub();
    return std::string(reinterpret_cast<const char*>(c.p), size_t(c.end - c.p));
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0: varint(); break;
      case 1: fixed<uint64_t>(); break;
      case 2: sub(); break;
      case 5: fixed<uint32_t>(); break;
      default:
        throw Error(detail::concat("[read_tensorboard_events] ", path, ": unsupported wire type ", wire_type,
                                   " in the record at byte ", record_offset));
    }
  }
  bool done() const { return p == end; }
};

// Summary.Value: tag = 1, simple_value = 2; other value kinds (images, tensors) are skipped.
void parse_value(Cursor c, TensorBoardEvent& ev) {
  std::string tag;
  bool has_simple = false;
  float simple = 0;
  while (!c.done()) {
    uint64_t key = c.varint();
    uint32_t field = uint32_t(key >> 3), type = uint32_t(key & 7);
    if (field == 1 && type == 2) tag = c.str();
    else if (field == 2 && type == 5) has_simple = true, simple = c.fixed<float>();
    else c.skip(type);
  }
  if (has_simple) ev.scalars.emplace_back(tag, simple);
}

TensorBoardEvent parse_event(Cursor c) {
  TensorBoardEvent ev;
  while (!c.done()) {
    uint64_t key = c.varint();
    uint32_t field = uint32_t(key >> 3), type = uint32_t(key & 7);
    if (field == 1 && type == 1) ev.wall_time = c.fixed<double>();
    else if (field == 2 && type == 0) ev.step = int64_t(c.varint());
    else if (field == 3 && type == 2) ev.file_version = c.str();
    else if (field == 5 && type == 2) {
      Cursor summary = c.sub();
      while (!summary.done()) {
        uint64_t skey = summary.varint();
        if ((skey >> 3) == 1 && (skey & 7) == 2) parse_value(summary.sub(), ev);
        else summary.skip(uint32_t(skey & 7));
      }
    } else c.skip(type);
  }
  return ev;
}

}  // namespace

std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[read_tensorboard_events] cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TensorBoardEvent> events;
  size_t pos = 0;
  while (pos < bytes.size()) {
    MT_CHECK(bytes.size() - pos >= 12, "[read_tensorboard_events] ", path, ": truncated record header at byte ", pos);
    uint64_t len;
    uint32_t len_crc;
    std::memcpy(&len, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    MT_CHECK(len_crc == masked_crc32c(bytes.data() + pos, 8), "[read_tensorboard_events] ", path,
             ": length CRC mismatch in the record at byte ", pos);
    uint64_t remaining = bytes.size() - pos - 12;
    MT_CHECK(remaining >= 4 && len <= remaining - 4, "[read_tensorboard_events] ", path, ": record at byte ", pos,
             " claims ", len, " data bytes but the file ends first");
    const char* data = bytes.data() + pos + 12;
    uint32_t data_crc;
    std::memcpy(&data_crc, data + len, 4);
    MT_CHECK(data_crc == masked_crc32c(data, len), "[read_tensorboard_events] ", path,
             ": data CRC mismatch in the record at byte ", pos);
    const auto* u = reinterpret_cast<const uint8_t*>(data);
    events.push_back(parse_event(Cursor{u, u + len, path, pos}));
    pos += 12 + len + 4;
  }
  return events;
}

}  // namespace mt::train
