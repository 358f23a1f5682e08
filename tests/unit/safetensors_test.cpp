// safetensors: bit-exact round trips of every engine dtype, zero-copy mapping (pointers
// inside the mapping, RSS flat, copy-on-write), sharded index loading, metadata, the
// conversions of dtypes the engine lacks, the real HF files in ../shared/data, and a clear
// error naming the file and the tensor for every kind of corrupt file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "meshtrain/meshtrain.h"
#include "tests/support/op_check.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_safetensors_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // A safetensors file from raw parts; `n` overrides the header length field.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        std::optional<uint64_t> n = std::nullopt) {
    std::string path = file(name);
    std::ofstream out(path, std::ios::binary);
    uint64_t len = n ? *n : header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << data;
    return path;
  }

  fs::path dir_;
};

// Random bit patterns (NaN payloads and subnormals included) for float dtypes: a round trip
// must preserve the bytes, not just the values.
Array random_bits(const Shape& shape, DType dtype, uint64_t seed) {
  Array a = Array::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  auto* b = static_cast<uint8_t*>(a.raw());
  for (size_t i = 0; i < a.nbytes(); ++i) b[i] = uint8_t(rng());
  if (dtype == DType::boolean)
    for (size_t i = 0; i < a.nbytes(); ++i) b[i] &= 1;
  return a;
}

bool same_bytes(const Array& a, const Array& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Params all_dtypes_params() {
  Params p;
  p.set("odd.bool", random_bits({9}, DType::boolean, 1));  // first, so later tensors would misalign in Params order
  p.set("w.f32", random_bits({3, 5}, DType::f32, 2));
  p.set("w.bf16", random_bits({7}, DType::bf16, 3));
  p.set("w.f16", random_bits({2, 3, 1}, DType::f16, 4));
  p.set("ids.i32", random_bits({5}, DType::i32, 5));
  p.set("ids.i64", random_bits({3}, DType::i64, 6));
  p.set("scalar", random_bits({}, DType::f32, 7));
  p.set("empty", Array::empty({0, 4}, DType::f32));
  p.set("unicode.ü/ß", random_bits({2}, DType::bf16, 8));
  return p;
}

TEST_F(SafetensorsTest, RoundTripIsBitIdenticalForEveryDtype) {
  Params p = all_dtypes_params();
  std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "12"}};
  std::string path = file("all.safetensors");
  io::save_safetensors(path, p, meta);

  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  EXPECT_EQ(f.keys(), p.paths());  // header in Params order
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.data_start() % 8, 0u);
  for (const auto& [name, a] : p) {
    const io::TensorInfo& ti = f.info(name);
    EXPECT_EQ(ti.dtype, a.dtype()) << name;
    EXPECT_EQ(ti.shape, a.shape()) << name;
    EXPECT_EQ(ti.file_dtype, io::safetensors_dtype_name(a.dtype()));
    EXPECT_EQ(ti.begin % dtype_size(a.dtype()), 0u) << name << " is not aligned";
    EXPECT_TRUE(same_bytes(f.get(name), a)) << name;
    std::cout << "  " << name << " " << ti.file_dtype << ti.shape.str() << " [" << ti.begin << ", " << ti.end << ")\n";
  }
  Params back = io::load_safetensors(path);
  ASSERT_EQ(back.paths(), p.paths());
  for (const auto& [name, a] : p) EXPECT_TRUE(same_bytes(back.at(name), a)) << name;

  // No metadata: no __metadata__ key; no temp files left behind.
  io::save_safetensors(path, p);
  EXPECT_TRUE(io::SafetensorsFile::open(path).metadata().empty());
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) entries += e.path().filename().string().find(".tmp.") == std::string::npos ? 1 : 100;
  EXPECT_EQ(entries, 1);
  // Permissions follow the umask like any created file (not mkstemp's 0600).
  mode_t mask = ::umask(022);
  ::umask(mask);
  EXPECT_EQ(int(fs::status(path).permissions()), int(0666 & ~mask));
}

TEST_F(SafetensorsTest, EmptyParamsRoundTrip) {
  io::save_safetensors(file("none.safetensors"), Params{});
  io::SafetensorsFile f = io::SafetensorsFile::open(file("none.safetensors"));
  EXPECT_TRUE(f.keys().empty());
  EXPECT_TRUE(io::load_safetensors(file("none.safetensors")).empty());
}

long rss_bytes() {
  std::ifstream in("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  in >> pages_total >> pages_resident;
  return pages_resident * ::sysconf(_SC_PAGESIZE);
}

TEST_F(SafetensorsTest, ReadingIsZeroCopyAndCopyOnWrite) {
  const int64_t n = 8 << 20;  // 32 MB of f32
  std::string path = file("big.safetensors");
  {
    Params p;
    p.set("small", Array::from_vector(std::vector<float>{1, 2, 3}, {3}));
    p.set("big", Array::full({n}, 0.5));
    io::save_safetensors(path, p);
  }
  long before = rss_bytes();
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  Params all = f.get_all();
  long after = rss_bytes();
  const Array& big = all.at("big");
  auto* lo = static_cast<const uint8_t*>(f.mapping());
  auto* p = static_cast<const uint8_t*>(big.raw());
  EXPECT_TRUE(p >= lo && p + big.nbytes() <= lo + f.file_size()) << "the array does not alias the mapping";
  EXPECT_EQ(p, lo + f.data_start() + f.info("big").begin);
  std::cout << "  RSS grew by " << (after - before) / 1024 << " KiB for a " << f.file_size() / 1024
            << " KiB file opened and fully loaded\n";
  EXPECT_LT(after - before, long(f.file_size() / 8)) << "loading copied the file";
  EXPECT_FALSE(all.at("big").shares_storage(all.at("small")));

  // Arrays keep the mapping alive after the file object is gone.
  Array small = all.at("small");
  all = Params{};
  f = io::SafetensorsFile::open(file("big.safetensors"));  // drops the first mapping object
  EXPECT_EQ(small.to_floats(), (std::vector<float>{1, 2, 3}));
  // In-place writes land in private pages: the file is unchanged.
  small.data<float>()[0] = 42;
  EXPECT_EQ(io::SafetensorsFile::open(path).get("small").to_floats(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(small.to_floats()[0], 42);
}

// A reader that copied a tensor out gives its mapped pages back; reading it again maps the
// same bytes anew.
TEST_F(SafetensorsTest, ReleasedTensorsLeaveResidentMemoryAndReadAgain) {
  const int64_t n = 8 << 20;  // 32 MB of f32
  std::string path = file("released.safetensors");
  io::save_safetensors(path, Params{{"big", Array::full({n}, 0.25)}});
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  double sum = 0;
  {
    const Array big = f.get("big");
    for (float v : big.to_floats()) sum += v;
  }
  const long touched = rss_bytes();
  f.release("big");
  const long released = rss_bytes();
  std::cout << "  RSS " << touched / 1024 << " KiB with the tensor read, " << released / 1024 << " KiB released\n";
  EXPECT_GT(touched - released, long(f.file_size() / 2)) << "the mapped pages stayed resident";
  EXPECT_DOUBLE_EQ(sum, 0.25 * double(n));
  const std::vector<float> again = f.get("big").to_floats();
  EXPECT_EQ(again.front(), 0.25f);
  EXPECT_EQ(again.back(), 0.25f);
}

TEST_F(SafetensorsTest, OverwritingAMappedFileKeepsOldArraysValid) {
  std::string path = file("w.safetensors");
  io::save_safetensors(path, Params{{"x", Array::from_vector(std::vector<float>{1, 2}, {2})}});
  Array old = io::load_safetensors(path).at("x");
  io::save_safetensors(path, Params{{"x", Array::from_vector(std::vector<float>{7, 8, 9}, {3})}});
  EXPECT_EQ(old.to_floats(), (std::vector<float>{1, 2}));  // rename replaced the inode, not its pages
  EXPECT_EQ(io::load_safetensors(path).at("x").to_floats(), (std::vector<float>{7, 8, 9}));
}

TEST_F(SafetensorsTest, ShardedIndexLoadsInWeightMapOrder) {
  Params p;
  for (int i = 0; i < 7; ++i) p.set("layer." + std::to_string(i) + ".w", random_bits({16, 3 + i}, DType::f32, 10 + i));
  p.set("mask", random_bits({5}, DType::boolean, 99));
  std::string d = file("sharded");
  std::vector<std::string> shards = io::save_safetensors_sharded(d, p, 600, {{"format", "pt"}});
  std::cout << "  " << shards.size() << " shards\n";
  ASSERT_GE(shards.size(), 3u);
  EXPECT_EQ(shards[0], "model-00001-of-0000" + std::to_string(shards.size()) + ".safetensors");
  for (const std::string& s : shards) EXPECT_EQ(io::SafetensorsFile::open(d + "/" + s).metadata().at("format"), "pt");
  for (const std::string& where : {d, d + "/model.safetensors.index.json"}) {
    Params back = io::load_safetensors(where);
    ASSERT_EQ(back.paths(), p.paths());
    for (const auto& [name, a] : p) EXPECT_TRUE(same_bytes(back.at(name), a)) << name;
  }
  nlohmann::json index = io::read_json_file(d + "/model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), size_t(p.total_elements() * 4 - 5 * 3));

  // A model.safetensors next to nothing else loads from the directory too.
  fs::create_directories(file("single"));
  io::save_safetensors(file("single/model.safetensors"), p);
  EXPECT_EQ(io::load_safetensors(file("single")).paths(), p.paths());

  // Broken indexes.
  std::string idx = d + "/model.safetensors.index.json";
  nlohmann::json bad = index;
  bad["weight_map"]["layer.0.w"] = "model-00009-of-00009.safetensors";
  io::write_file_atomic(idx, bad.dump());
  expect_error([&] { io::load_safetensors(d); }, {idx, "model-00009-of-00009.safetensors", "missing", "layer.0.w"});
  bad = index;
  bad["weight_map"]["layer.0.w"] = shards[1];
  io::write_file_atomic(idx, bad.dump());
  expect_error([&] { io::load_safetensors(d); }, {idx, "layer.0.w", shards[0]});
  bad = index;
  bad["weight_map"]["ghost"] = shards[0];
  io::write_file_atomic(idx, bad.dump());
  expect_error([&] { io::load_safetensors(d); }, {idx, "ghost", "does not hold it"});
  bad = index;
  bad["weight_map"]["layer.0.w"] = "../escape.safetensors";
  io::write_file_atomic(idx, bad.dump());
  expect_error([&] { io::load_safetensors(d); }, {idx, "relative path"});
  bad = index;
  bad.erase("weight_map");
  io::write_file_atomic(idx, bad.dump());
  expect_error([&] { io::load_safetensors(d); }, {idx, "weight_map"});
  io::write_file_atomic(idx, "{\"weight_map\": {");
  expect_error([&] { io::load_safetensors(d); }, {idx, "parse error"});
  fs::remove(idx);
  expect_error([&] { io::load_safetensors(d); }, {d, "neither model.safetensors nor model.safetensors.index.json"});
  expect_error([&] { io::load_safetensors(file("nope")); }, {file("nope"), "no such file"});
}

TEST_F(SafetensorsTest, DtypesTheEngineLacksAreConverted) {
  // Hand-made: F64, I8, U8, I16, U16, U32, U64, F8_E4M3, F8_E5M2, a BOOL with a byte 2, all packed.
  std::string data;
  auto put = [&](const auto& v) { data.append(reinterpret_cast<const char*>(&v), sizeof v); };
  double f64[2] = {1.5, -3.25};
  int8_t i8[2] = {-128, 127};
  uint8_t u8[2] = {0, 255};
  int16_t i16[2] = {-32768, 1234};
  uint16_t u16[2] = {65535, 7};
  uint32_t u32[2] = {4294967295u, 3};
  uint64_t u64[2] = {uint64_t(1) << 62, 5};
  uint8_t e4m3[4] = {0x38, 0xC0, 0x01, 0x7F};  // 1.0, -2.0, smallest subnormal 2^-9, NaN
  uint8_t e5m2[3] = {0x3C, 0xC0, 0x7C};        // 1.0, -2.0, inf
  uint8_t boolean[3] = {0, 2, 1};
  put(f64), put(u64), put(u32), put(i16), put(u16), put(i8), put(u8), put(e4m3), put(e5m2), put(boolean);
  std::string h = R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"U64","shape":[2],"data_offsets":[16,32]},)"
                  R"("c":{"dtype":"U32","shape":[2],"data_offsets":[32,40]},)"
                  R"("d":{"dtype":"I16","shape":[2],"data_offsets":[40,44]},)"
                  R"("e":{"dtype":"U16","shape":[2],"data_offsets":[44,48]},)"
                  R"("f":{"dtype":"I8","shape":[2],"data_offsets":[48,50]},)"
                  R"("g":{"dtype":"U8","shape":[2],"data_offsets":[50,52]},)"
                  R"("h":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[52,56]},)"
                  R"("i":{"dtype":"F8_E5M2","shape":[3],"data_offsets":[56,59]},)"
                  R"("j":{"dtype":"BOOL","shape":[3],"data_offsets":[59,62]}})";
  while ((8 + h.size()) % 8) h += ' ';
  io::SafetensorsFile f = io::SafetensorsFile::open(write_raw("conv.safetensors", h, data));
  EXPECT_EQ(f.get("a").dtype(), DType::f32);
  EXPECT_EQ(f.get("a").to_floats(), (std::vector<float>{1.5f, -3.25f}));
  EXPECT_EQ(f.get("b").dtype(), DType::i64);
  EXPECT_EQ(f.get("b").to_ints(), (std::vector<int64_t>{int64_t(1) << 62, 5}));
  EXPECT_EQ(f.get("c").to_ints(), (std::vector<int64_t>{4294967295ll, 3}));
  EXPECT_EQ(f.get("d").dtype(), DType::i32);
  EXPECT_EQ(f.get("d").to_ints(), (std::vector<int64_t>{-32768, 1234}));
  EXPECT_EQ(f.get("e").to_ints(), (std::vector<int64_t>{65535, 7}));
  EXPECT_EQ(f.get("f").to_ints(), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(f.get("g").to_ints(), (std::vector<int64_t>{0, 255}));
  std::vector<float> h8 = f.get("h").to_floats();
  EXPECT_EQ(h8[0], 1.0f);
  EXPECT_EQ(h8[1], -2.0f);
  EXPECT_EQ(h8[2], std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(h8[3]));
  std::vector<float> i8f = f.get("i").to_floats();
  EXPECT_EQ(i8f[0], 1.0f);
  EXPECT_EQ(i8f[1], -2.0f);
  EXPECT_TRUE(std::isinf(i8f[2]));
  Array j = f.get("j");
  EXPECT_EQ(j.dtype(), DType::boolean);
  EXPECT_EQ(j.to_ints(), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(static_cast<const uint8_t*>(j.raw())[1], 1);  // normalized copy, not the raw 2

  // U64 beyond i64: a clear error when read.
  uint64_t huge = ~uint64_t(0);
  std::string h2 = R"({"big":{"dtype":"U64","shape":[1],"data_offsets":[0,8]}})";
  std::string p2 = write_raw("u64.safetensors", h2, std::string(reinterpret_cast<const char*>(&huge), 8));
  expect_error([&] { io::SafetensorsFile::open(p2).get("big"); }, {p2, "big", "does not fit"});
}

TEST_F(SafetensorsTest, MisalignedDataIsCopiedNotAliased) {
  // A 3-byte header makes the data start at offset 11: f32 cannot be aliased there.
  float v[2] = {3.5f, -1.0f};
  std::string h = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + h.size()) % 4, 0u);
  io::SafetensorsFile f = io::SafetensorsFile::open(write_raw("mis.safetensors", h, std::string(reinterpret_cast<char*>(v), 8)));
  Array x = f.get("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw()) % 4, 0u);
  EXPECT_EQ(x.to_floats(), (std::vector<float>{3.5f, -1.0f}));
}

TEST_F(SafetensorsTest, CorruptFilesGiveClearErrors) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\0');
  struct Case {
    const char* name;
    std::string header;
    std::string data;
    std::optional<uint64_t> n;
    std::vector<std::string> needles;
  };
  std::vector<Case> cases = {
      {"header_too_long", "{" + ok_entry + "}", data8, 1000000, {"header length 1000000 exceeds"}},
      {"huge_header_len", "{" + ok_entry + "}", data8, ~uint64_t(0), {"exceeds"}},
      {"invalid_json", "{\"t\": {\"dtype\": \"F32\",", data8, std::nullopt, {"invalid JSON header", "parse error"}},
      {"not_an_object", "[1, 2]", data8, std::nullopt, {"does not start with '{'"}},
      {"unknown_dtype", R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", data8, std::nullopt,
       {"tensor 't'", "unknown or unsupported dtype 'Q7'"}},
      {"offsets_past_end", R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data8, std::nullopt,
       {"tensor 't'", "run past the end of the data"}},
      {"out_of_order", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data8, std::nullopt,
       {"tensor 't'", "out of order"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, '\0'), std::nullopt, {"tensor 'b'", "overlap those of 'a'"}},
      {"size_mismatch", R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8, std::nullopt,
       {"tensor 't'", "shape (3,) of F32 needs 12 bytes but data_offsets [0, 8] span 8"}},
      {"bf16_size_mismatch", R"({"t":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", data8, std::nullopt,
       {"tensor 't'", "needs 12 bytes"}},
      {"hole", R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8, std::nullopt,
       {"hole of 4 bytes", "tensor 't'"}},
      {"trailing", "{" + ok_entry + "}", std::string(12, '\0'), std::nullopt, {"4 bytes after the last tensor"}},
      {"duplicate", "{" + ok_entry + "," + ok_entry + "}", data8, std::nullopt, {"duplicate key 't'"}},
      {"negative_dim", R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8, std::nullopt,
       {"tensor 't'", "non-negative integers"}},
      {"float_dim", R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data8, std::nullopt,
       {"tensor 't'", "non-negative integers"}},
      {"overflowing_shape", R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data8,
       std::nullopt, {"tensor 't'", "overflows"}},
      {"missing_offsets", R"({"t":{"dtype":"F32","shape":[2]}})", data8, std::nullopt, {"tensor 't'", "missing 'data_offsets'"}},
      {"bad_offsets", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data8, std::nullopt,
       {"tensor 't'", "data_offsets must be [begin, end]"}},
      {"entry_not_object", R"({"t":[1,2]})", data8, std::nullopt, {"tensor 't'", "must be an object"}},
      {"metadata_not_strings", R"({"__metadata__":{"step":3},)" + ok_entry + "}", data8, std::nullopt,
       {"__metadata__", "'step'", "must be a string"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = write_raw(std::string(c.name) + ".safetensors", c.header, c.data, c.n);
    std::vector<std::string> needles = c.needles;
    needles.push_back("[safetensors] " + path + ": ");
    expect_error([&] { io::SafetensorsFile::open(path); }, needles);
    expect_error([&] { io::load_safetensors(path); }, needles);
  }
  // Too short for the length field; empty; a directory; a missing file.
  std::string tiny = file("tiny.safetensors");
  std::ofstream(tiny) << "abc";
  expect_error([&] { io::SafetensorsFile::open(tiny); }, {tiny, "3 bytes, too short"});
  std::string empty = file("empty.safetensors");
  std::ofstream{empty};
  expect_error([&] { io::SafetensorsFile::open(empty); }, {empty, "0 bytes"});
  expect_error([&] { io::SafetensorsFile::open(dir_.string()); }, {dir_.string(), "not a regular file"});
  expect_error([&] { io::SafetensorsFile::open(file("missing")); }, {file("missing"), "cannot open"});

  // A real file truncated anywhere: an error, never a crash.
  std::string real = std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2/model.safetensors";
  std::ifstream in(real, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1400u) << "cannot read " << real;
  for (size_t cut : {size_t(0), size_t(5), size_t(8), size_t(100), size_t(1400), bytes.size() / 2, bytes.size() - 1}) {
    std::string t = file("cut.safetensors");
    std::ofstream(t, std::ios::binary).write(bytes.data(), std::streamsize(cut));
    expect_error([&] { io::SafetensorsFile::open(t); }, {t});
  }
  // Every single-byte corruption of the header is either still valid or a clean mt::Error.
  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  int errors = 0, valid = 0;
  for (size_t i = 0; i < 8 + hn; i += 7) {
    std::string c = bytes;
    c[i] = char(c[i] ^ 0x5a);
    std::string t = file("flip.safetensors");
    std::ofstream(t, std::ios::binary).write(c.data(), std::streamsize(c.size()));
    try {
      io::SafetensorsFile f = io::SafetensorsFile::open(t);
      for (const std::string& k : f.keys()) f.get(k);
      ++valid;
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find(t), std::string::npos) << e.what();
    }
  }
  std::cout << "  header byte flips: " << errors << " errors, " << valid << " still valid\n";
  EXPECT_GT(errors, 0);
}

TEST_F(SafetensorsTest, SaveRejectsBadInput) {
  Array sharded = Array::zeros({4});
  sharded.impl()->layout = std::make_shared<dist::Sharding>();
  expect_error([&] { io::save_safetensors(file("s.safetensors"), Params{{"w", sharded}}); },
               {file("s.safetensors"), "'w'", "sharded", "dist::to_host"});
  expect_error([&] { io::save_safetensors(file("s.safetensors"), Params{{"__metadata__", Array::zeros({1})}}); },
               {"reserved"});
  expect_error([&] { io::save_safetensors(file("s.safetensors"), Params{{"u", Array()}}); }, {"'u'", "undefined"});
  expect_error([&] { io::save_safetensors(file("nodir/x.safetensors"), Params{{"w", Array::zeros({1})}}); },
               {file("nodir/x.safetensors"), "cannot create a temporary file"});
  expect_error([&] { io::save_safetensors(file("bad.safetensors"), Params{{std::string("bad\xff"), Array::zeros({1})}}); },
               {file("bad.safetensors"), "UTF-8"});
  EXPECT_FALSE(fs::exists(file("s.safetensors")));
  for (const auto& e : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << e.path();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The streaming writer (what an export uses to write one gathered tensor at a time) gives the
// bytes save_safetensors gives, lays larger elements first, and checks each tensor it is given.
TEST_F(SafetensorsTest, StreamedFileEqualsTheWholeSave) {
  Params tensors;
  tensors.set("h.bf16", random_bits({3, 5}, DType::bf16, 1));
  tensors.set("a.f32", random_bits({7}, DType::f32, 2));
  tensors.set("z.bool", random_bits({3}, DType::boolean, 3));
  tensors.set("m.i64", random_bits({2, 2}, DType::i64, 4));
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  io::save_safetensors(file("whole.safetensors"), tensors, meta);

  std::vector<io::TensorHeader> headers;
  for (const auto& [name, a] : tensors) headers.push_back({name, a.dtype(), a.shape()});
  const std::vector<size_t> order = io::safetensors_data_order(headers);
  EXPECT_EQ(order, (std::vector<size_t>{3, 1, 0, 2}));  // i64, f32, bf16, bool; ties as given
  {
    io::SafetensorsWriter w(file("streamed.safetensors"), headers, meta);
    std::vector<std::string> seen;
    while (const io::TensorHeader* next = w.next()) {
      seen.push_back(next->name);
      w.write(tensors.at(next->name));
    }
    EXPECT_EQ(seen, (std::vector<std::string>{"m.i64", "a.f32", "h.bf16", "z.bool"}));
    w.commit();
  }
  const std::string whole = file_bytes(file("whole.safetensors")), streamed = file_bytes(file("streamed.safetensors"));
  EXPECT_FALSE(whole.empty());
  EXPECT_TRUE(whole == streamed) << "the streamed file differs from save_safetensors' (" << streamed.size() << " vs "
                                 << whole.size() << " bytes)";
  std::cout << "  streamed and whole files: " << whole.size() << " identical bytes\n";
}

TEST_F(SafetensorsTest, StreamedWriterChecksEachTensorAndLeavesNoPartialFile) {
  io::save_safetensors(file("keep.safetensors"), Params{{"old", Array::full({2}, 5.0f)}});
  const std::string before = file_bytes(file("keep.safetensors"));
  const std::vector<io::TensorHeader> headers{{"w", DType::f32, Shape({2, 3})}, {"b", DType::f32, Shape({3})}};
  {
    io::SafetensorsWriter w(file("keep.safetensors"), headers);
    expect_error([&] { w.write(Array::zeros({3, 2})); }, {file("keep.safetensors"), "'w'", "(2, 3)"});
    expect_error([&] { w.write(Array::zeros({2, 3}, DType::bf16)); }, {"'w'", "bf16"});
    w.write(Array::zeros({2, 3}));
    expect_error([&] { w.commit(); }, {file("keep.safetensors"), "'b'", "never written"});
  }  // dropped uncommitted: the older file stays as it was, no temporary is left
  EXPECT_EQ(file_bytes(file("keep.safetensors")), before);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.path().filename() != "keep.safetensors" ? 1 : 0;
  EXPECT_EQ(files, 0u);
  expect_error([&] { io::SafetensorsWriter(file("d.safetensors"), {{"x", DType::f32, Shape({1})}, {"x", DType::f32, Shape({1})}}); },
               {file("d.safetensors"), "'x'", "twice"});
}

TEST_F(SafetensorsTest, MissingKeyIsNamed) {
  io::save_safetensors(file("k.safetensors"), Params{{"a", Array::zeros({1})}});
  io::SafetensorsFile f = io::SafetensorsFile::open(file("k.safetensors"));
  EXPECT_TRUE(f.contains("a"));
  EXPECT_FALSE(f.contains("b"));
  expect_error([&] { f.info("b"); }, {file("k.safetensors"), "no tensor named 'b'"});
  expect_error([&] { f.get("b"); }, {file("k.safetensors"), "'b'"});
}

void list_file(const io::SafetensorsFile& f) {
  std::cout << "  " << f.path() << ": " << f.keys().size() << " tensors, metadata:";
  for (const auto& [k, v] : f.metadata()) std::cout << " " << k << "=" << v;
  std::cout << "\n";
  for (const std::string& k : f.keys()) std::cout << "    " << k << " " << f.info(k).file_dtype << f.info(k).shape.str() << "\n";
}

TEST(SafetensorsRealFiles, HfTinyBertAndGpt2) {
  const std::string models = std::string(MT_DATA_DIR) + "/models";
  {
    io::SafetensorsFile f = io::SafetensorsFile::open(models + "/hf-tiny-bert/model.safetensors");
    list_file(f);
    nlohmann::json cfg = io::read_json_file(models + "/hf-tiny-bert/config.json");
    io::JsonRef c(cfg, "config.json");
    const int64_t hidden = c.get<int64_t>("hidden_size"), vocab = c.get<int64_t>("vocab_size");
    const int64_t inter = c.get<int64_t>("intermediate_size"), pos = c.get<int64_t>("max_position_embeddings");
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.info("bert.embeddings.word_embeddings.weight").shape, (Shape{vocab, hidden}));
    EXPECT_EQ(f.info("bert.embeddings.position_embeddings.weight").shape, (Shape{pos, hidden}));
    EXPECT_EQ(f.info("bert.encoder.layer.0.attention.self.query.weight").shape, (Shape{hidden, hidden}));
    EXPECT_EQ(f.info("bert.encoder.layer.0.intermediate.dense.weight").shape, (Shape{inter, hidden}));
    for (const std::string& k : f.keys()) {
      Array a = f.get(k);
      EXPECT_EQ(a.dtype(), DType::f32);
      auto* p = static_cast<const uint8_t*>(a.raw());
      EXPECT_TRUE(p >= static_cast<const uint8_t*>(f.mapping()) && p < static_cast<const uint8_t*>(f.mapping()) + f.file_size());
    }
    EXPECT_EQ(io::load_safetensors(models + "/hf-tiny-bert").size(), f.keys().size());
  }
  {
    io::SafetensorsFile f = io::SafetensorsFile::open(models + "/hf-tiny-gpt2/model.safetensors");
    list_file(f);
    nlohmann::json cfg = io::read_json_file(models + "/hf-tiny-gpt2/config.json");
    io::JsonRef c(cfg, "config.json");
    const int64_t d = c.get<int64_t>("n_embd"), vocab = c.get<int64_t>("vocab_size"), npos = c.get<int64_t>("n_positions");
    EXPECT_EQ(f.info("transformer.wte.weight").shape, (Shape{vocab, d}));
    EXPECT_EQ(f.info("transformer.wpe.weight").shape, (Shape{npos, d}));
    EXPECT_EQ(f.info("transformer.h.0.attn.c_attn.weight").shape, (Shape{d, 3 * d}));  // Conv1D: [in, out]
    Params p = io::load_safetensors(models + "/hf-tiny-gpt2");
    EXPECT_EQ(p.paths(), f.keys());
    EXPECT_TRUE(std::isfinite(p.at("transformer.wte.weight").to_doubles()[12345]));
  }
}

TEST(Json, ErrorsNameTheFileAndThePath) {
  fs::path d = fs::temp_directory_path() / ("mt_json_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::string good = (d / "config.json").string(), bad = (d / "bad.json").string();
  std::ofstream(good) << R"({"hidden_size": 4, "name": "x", "ratio": 0.5, "dims": [1, 2, "three"], "nested": {"a/b": {"n": 3.5}}, "flag": true, "none": null})";
  std::ofstream(bad) << "{\n  \"a\": 1,\n  \"b\": }\n";
  nlohmann::json j = io::read_json_file(good);
  io::JsonRef r(j, good);
  EXPECT_EQ(r.get<int>("hidden_size"), 4);
  EXPECT_EQ(r.get<std::string>("name"), "x");
  EXPECT_EQ(r.get<double>("ratio"), 0.5);
  EXPECT_EQ(r.get<double>("hidden_size"), 4.0);  // an integer is a fine float
  EXPECT_TRUE(r.get<bool>("flag"));
  EXPECT_EQ(r.get_or<int>("missing", 7), 7);
  EXPECT_EQ(r.get_or<int>("none", 8), 8);
  EXPECT_EQ(r.at("dims").at(1).as<int>(), 2);
  expect_error([&] { r.get<int>("hidden"); }, {good, "missing key 'hidden'"});
  expect_error([&] { r.get<int>("name"); }, {good, "/name", "expected an integer, got a string"});
  expect_error([&] { r.get<int>("ratio"); }, {good, "/ratio", "expected an integer, got a float"});
  expect_error([&] { r.get_or<int>("name", 1); }, {good, "/name", "expected an integer"});
  expect_error([&] { r.get<std::vector<int>>("dims"); }, {good, "/dims/2", "expected an integer, got a string"});
  expect_error([&] { r.at("nested").at("a/b").get<int>("n"); }, {good, "/nested/a~1b/n", "expected an integer"});
  expect_error([&] { r.at("nested").at("a/b").get<uint8_t>("q"); }, {good, "/nested/a~1b", "missing key 'q'"});
  expect_error([&] { r.at("dims").at(5); }, {good, "/dims", "index 5 is out of range"});
  expect_error([&] { io::JsonRef(nlohmann::json(300), good).as<uint8_t>(); }, {"300 is out of range"});
  expect_error([&] { io::read_json_file(bad); }, {bad, "line 3"});
  expect_error([&] { io::read_json_file((d / "nope.json").string()); }, {"nope.json", "cannot open"});
  fs::remove_all(d);
}

}  // namespace
}  // namespace mt
