// llama2.c legacy checkpoints: stories260K loads with the documented config, every
// parameter has its HF LLaMA name and shape, the file length matches its header exactly,
// weights alias the mapping, and truncated/extended/garbage files give clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "meshtrain/meshtrain.h"
#include "tests/support/op_check.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

const std::string kStories = std::string(MT_DATA_DIR) + "/models/stories260K/stories260K.bin";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::map<std::string, Shape> expected_shapes(const io::Llama2cConfig& c) {
  const int64_t D = c.dim, F = c.hidden_dim, V = c.vocab_size, KV = int64_t(c.n_kv_heads) * (c.dim / c.n_heads);
  std::map<std::string, Shape> s;
  s["model.embed_tokens.weight"] = {V, D};
  s["model.norm.weight"] = {D};
  s["lm_head.weight"] = {V, D};
  for (int i = 0; i < c.n_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    s[p + "input_layernorm.weight"] = {D};
    s[p + "post_attention_layernorm.weight"] = {D};
    s[p + "self_attn.q_proj.weight"] = {D, D};
    s[p + "self_attn.k_proj.weight"] = {KV, D};
    s[p + "self_attn.v_proj.weight"] = {KV, D};
    s[p + "self_attn.o_proj.weight"] = {D, D};
    s[p + "mlp.gate_proj.weight"] = {F, D};
    s[p + "mlp.up_proj.weight"] = {F, D};
    s[p + "mlp.down_proj.weight"] = {D, F};
  }
  return s;
}

TEST(Llama2c, Stories260KConfigShapesAndFileLength) {
  io::Llama2cCheckpoint ck = io::load_llama2c(kStories);
  const io::Llama2cConfig& c = ck.config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_TRUE(c.rotary_interleaved);
  EXPECT_EQ(c.head_dim(), 8);

  // The length run.c's memory_map_weights walks, written out independently: header, then
  // floats: emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, 2 x freq_cis.
  const uint64_t D = 64, F = 172, L = 5, V = 512, S = 512, hd = 8, kv = 4 * hd;
  uint64_t floats = V * D + L * D + L * D * D + 2 * L * D * kv + L * D * D + L * D + 3 * L * D * F + D + 2 * S * hd / 2;
  uint64_t size = uint64_t(fs::file_size(kStories));
  EXPECT_EQ(size, 28 + 4 * floats);
  EXPECT_EQ(io::llama2c_file_size(c), size);
  std::cout << "  " << kStories << ": " << size << " bytes = 28 + 4 x " << floats << " floats\n";

  std::map<std::string, Shape> want = expected_shapes(c);
  EXPECT_EQ(ck.params.size(), want.size());
  int64_t n = 0;
  for (const auto& [name, a] : ck.params) {
    ASSERT_TRUE(want.count(name)) << "unexpected " << name;
    EXPECT_EQ(a.shape(), want.at(name)) << name;
    EXPECT_EQ(a.dtype(), DType::f32);
    if (name != "lm_head.weight") n += a.numel();
    for (float v : a.to_floats()) ASSERT_TRUE(std::isfinite(v)) << name;
  }
  EXPECT_EQ(uint64_t(n + 2 * ck.freq_cis_real.numel()), floats);
  std::cout << "  " << ck.params.size() << " tensors, " << n << " parameters\n";

  // Tied classifier: the very same array as the embedding.
  EXPECT_TRUE(ck.params.at("lm_head.weight").shares_storage(ck.params.at("model.embed_tokens.weight")));
  EXPECT_EQ(ck.params.at("lm_head.weight").raw(), ck.params.at("model.embed_tokens.weight").raw());
  // Zero-copy: every weight is a view of one mapping, at its exact file offset.
  auto addr = [&](const std::string& k) { return static_cast<const char*>(ck.params.at(k).raw()); };
  const char* base = addr("model.embed_tokens.weight") - 28;
  EXPECT_EQ(addr("model.layers.0.input_layernorm.weight") - base, long(28 + 4 * V * D));
  EXPECT_EQ(addr("model.layers.1.self_attn.q_proj.weight") - addr("model.layers.0.self_attn.q_proj.weight"), long(4 * D * D));
  EXPECT_EQ(addr("model.norm.weight") - base, long(28 + 4 * (floats - D - S * hd)));
  EXPECT_EQ(static_cast<const char*>(ck.freq_cis_imag.raw()) + 4 * S * hd / 2 - base, long(size));
  std::string bytes = read_bytes(kStories);
  EXPECT_EQ(std::memcmp(addr("model.layers.3.mlp.down_proj.weight"),
                        bytes.data() + (addr("model.layers.3.mlp.down_proj.weight") - base), 4 * D * F), 0);

  // The stored freq_cis must be cos/sin(pos * 10000^(-2i/hd)): this checks every offset
  // before it and the rope_theta we report.
  std::vector<float> re = ck.freq_cis_real.to_floats(), im = ck.freq_cis_imag.to_floats();
  double max_err = 0;
  for (uint64_t pos = 0; pos < S; ++pos)
    for (uint64_t i = 0; i < hd / 2; ++i) {
      double angle = double(pos) * std::pow(double(c.rope_theta), -double(2 * i) / double(hd));
      max_err = std::max({max_err, std::abs(re[pos * hd / 2 + i] - std::cos(angle)),
                          std::abs(im[pos * hd / 2 + i] - std::sin(angle))});
    }
  std::cout << "  freq_cis max error vs cos/sin: " << max_err << "\n";
  EXPECT_LT(max_err, 1e-4);

  nlohmann::json hf = io::llama2c_hf_config(c);
  EXPECT_EQ(hf["hidden_size"], 64);
  EXPECT_EQ(hf["num_key_value_heads"], 4);
  EXPECT_EQ(hf["tie_word_embeddings"], true);
  EXPECT_EQ(hf["rotary_interleaved"], true);
}

class Llama2cFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_llama2c_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(Llama2cFiles, RoundTripWithUnsharedClassifier) {
  io::Llama2cConfig c{.dim = 8, .hidden_dim = 12, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .vocab_size = 11,
                      .seq_len = 5, .shared_classifier = false};
  Params p;
  uint64_t seed = 1;
  for (const auto& [name, shape] : expected_shapes(c)) p.set(name, testing::random_normal(shape, seed++));
  std::string path = file("tiny.bin");
  io::save_llama2c(path, c, p);
  EXPECT_EQ(fs::file_size(path), io::llama2c_file_size(c));
  int32_t h[7];
  std::memcpy(h, read_bytes(path).data(), 28);
  EXPECT_EQ(h[5], -11);  // negative vocab = unshared classifier

  io::Llama2cCheckpoint ck = io::load_llama2c(path);
  EXPECT_FALSE(ck.config.shared_classifier);
  EXPECT_EQ(ck.config.vocab_size, 11);
  EXPECT_EQ(ck.params.size(), p.size());
  for (const auto& [name, a] : p) {
    const Array& b = ck.params.at(name);
    ASSERT_EQ(b.shape(), a.shape()) << name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
  }
  EXPECT_FALSE(ck.params.at("lm_head.weight").shares_storage(ck.params.at("model.embed_tokens.weight")));

  // Shared: lm_head is not written and comes back as the embedding.
  c.shared_classifier = true;
  io::save_llama2c(path, c, p);
  io::Llama2cCheckpoint shared = io::load_llama2c(path);
  EXPECT_TRUE(shared.config.shared_classifier);
  EXPECT_EQ(shared.params.at("lm_head.weight").raw(), shared.params.at("model.embed_tokens.weight").raw());

  Params missing = p;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  expect_error([&] { io::save_llama2c(path, c, missing); }, {path, "missing parameter 'model.layers.1.mlp.up_proj.weight'"});
  Params wrong = p;
  wrong.set("model.norm.weight", Array::zeros({9}));
  expect_error([&] { io::save_llama2c(path, c, wrong); }, {path, "'model.norm.weight'", "(9,)", "(8,)"});
}

TEST_F(Llama2cFiles, CorruptFilesGiveClearErrors) {
  std::string bytes = read_bytes(kStories);
  auto with = [&](const std::string& name, const std::string& b) {
    write_bytes(file(name), b);
    return file(name);
  };
  std::string p = with("short.bin", bytes.substr(0, bytes.size() - 4));
  expect_error([&] { io::load_llama2c(p); }, {"[llama2c] " + p, "1056536 bytes", "implies 1056540", "4 bytes missing"});
  p = with("long.bin", bytes + "abcd");
  expect_error([&] { io::load_llama2c(p); }, {"[llama2c] " + p, "4 unexpected trailing bytes"});
  p = with("header_only.bin", bytes.substr(0, 28));
  expect_error([&] { io::load_llama2c(p); }, {p, "bytes missing"});
  p = with("tiny.bin", bytes.substr(0, 10));
  expect_error([&] { io::load_llama2c(p); }, {p, "10 bytes, too short for the 28-byte header"});
  p = with("empty.bin", "");
  expect_error([&] { io::load_llama2c(p); }, {p, "0 bytes"});
  expect_error([&] { io::load_llama2c(file("missing.bin")); }, {file("missing.bin"), "cannot open"});

  auto patched = [&](const std::string& name, int field, int32_t value) {
    std::string b = bytes;
    std::memcpy(b.data() + 4 * field, &value, 4);
    return with(name, b);
  };
  p = patched("zero_heads.bin", 3, 0);
  expect_error([&] { io::load_llama2c(p); }, {p, "must be positive", "n_heads=0"});
  p = patched("bad_heads.bin", 3, 7);
  expect_error([&] { io::load_llama2c(p); }, {p, "dim is not a multiple of n_heads"});
  p = patched("bad_kv.bin", 4, 3);
  expect_error([&] { io::load_llama2c(p); }, {p, "n_heads is not a multiple of n_kv_heads"});
  p = patched("huge.bin", 0, 1 << 30);
  expect_error([&] { io::load_llama2c(p); }, {p, "impossibly large"});
  p = patched("odd_head.bin", 3, 64);
  expect_error([&] { io::load_llama2c(p); }, {p, "head_dim 1 must be even"});
  p = patched("neg_layers.bin", 2, -5);
  expect_error([&] { io::load_llama2c(p); }, {p, "must be positive"});
  p = patched("min_vocab.bin", 5, INT32_MIN);
  expect_error([&] { io::load_llama2c(p); }, {p, "must be positive"});
  p = patched("unshared.bin", 5, -512);  // claims an extra classifier the file lacks
  expect_error([&] { io::load_llama2c(p); }, {p, "vocab_size=-512", "bytes missing"});
  p = patched("v1.bin", 0, 0x616b3432);
  expect_error([&] { io::load_llama2c(p); }, {p, "ak42", "legacy"});
  // Random garbage headers: errors, never crashes.
  std::mt19937 rng(7);
  for (int i = 0; i < 100; ++i) {
    std::string b = bytes.substr(0, 4096);
    for (int k = 0; k < 28; ++k) b[size_t(k)] = char(rng());
    write_bytes(file("garbage.bin"), b);
    EXPECT_THROW(io::load_llama2c(file("garbage.bin")), Error);
  }
}

}  // namespace
}  // namespace mt
