#include "meshtrain/io/llama2c.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/io/mapped_file.h"

namespace mt::io {

namespace {

constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
// export.py's v1/v2 files start with the uint32 magic "ak42"; they are not legacy files.
constexpr uint32_t kVersionedMagic = 0x616b3432;

std::string header_text(const Llama2cConfig& c) {
  return detail::concat("dim=", c.dim, ", hidden_dim=", c.hidden_dim, ", n_layers=", c.n_layers,
                        ", n_heads=", c.n_heads, ", n_kv_heads=", c.n_kv_heads, ", vocab_size=",
                        c.shared_classifier || c.vocab_size < 0 ? "" : "-", c.vocab_size, ", seq_len=", c.seq_len);
}

void validate(const Llama2cConfig& c, const std::string& where) {
  auto bad = [&](const auto&... parts) {
    return Error(detail::concat("[llama2c] ", where, ": ", parts..., " (header: ", header_text(c), ")"));
  };
  if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab_size <= 0 ||
      c.seq_len <= 0)
    throw bad("every header field must be positive");
  if (c.dim % c.n_heads != 0) throw bad("dim is not a multiple of n_heads");
  if (c.n_heads % c.n_kv_heads != 0) throw bad("n_heads is not a multiple of n_kv_heads");
  if (c.head_dim() % 2 != 0) throw bad("head_dim ", c.head_dim(), " must be even for rotary embeddings");
}

// Float counts of each block of the file, in file order.
struct Layout {
  uint64_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq, wcls;
  unsigned __int128 total_floats() const {
    unsigned __int128 t = 0;
    for (uint64_t v : {emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq, freq, wcls}) t += v;
    return t;
  }
};

Layout layout_of(const Llama2cConfig& c, const std::string& where) {
  // Every factor fits in 31 bits, so a product of at most three fits in 93 bits: count in
  // 128-bit and reject what does not fit 64-bit (a garbage header can be that large).
  using u128 = unsigned __int128;
  auto checked = [&](u128 v) {
    MT_CHECK(v < (u128(1) << 61), "[llama2c] ", where, ": header implies an impossibly large file (", header_text(c), ")");
    return uint64_t(v);
  };
  u128 D = u128(c.dim), F = u128(c.hidden_dim), L = u128(c.n_layers), V = u128(c.vocab_size), S = u128(c.seq_len);
  u128 hd = u128(c.head_dim()), kv = u128(c.n_kv_heads) * hd;
  Layout l{};
  l.emb = checked(V * D);
  l.rms_att = checked(L * D);
  l.wq = checked(L * D * D);
  l.wk = checked(L * D * kv);
  l.wv = checked(L * D * kv);
  l.wo = checked(L * D * D);
  l.rms_ffn = checked(L * D);
  l.w1 = checked(L * D * F);
  l.w2 = checked(L * F * D);
  l.w3 = checked(L * D * F);
  l.rms_final = checked(D);
  l.freq = checked(S * hd / 2);
  l.wcls = c.shared_classifier ? 0 : l.emb;
  checked(l.total_floats() * 4 + kHeaderBytes);
  return l;
}

std::string layer_key(int i, const char* rest) { return detail::concat("model.layers.", i, ".", rest); }

}  // namespace

uint64_t llama2c_file_size(const Llama2cConfig& config) {
  validate(config, "config");
  return uint64_t(layout_of(config, "config").total_floats() * 4 + kHeaderBytes);
}

Llama2cCheckpoint load_llama2c(const std::string& path) {
  auto file = MappedFile::open(path, "llama2c");
  const size_t size = file->size();
  MT_CHECK(size >= kHeaderBytes, "[llama2c] ", path, ": file has ", size, " bytes, too short for the ", kHeaderBytes,
           "-byte header");
  int32_t h[7];
  std::memcpy(h, file->data(), kHeaderBytes);
  MT_CHECK(uint32_t(h[0]) != kVersionedMagic, "[llama2c] ", path,
           ": this is a versioned llama2.c export (magic \"ak42\", version ", h[1],
           "); only the legacy v0 format is supported (export.py --version 0)");
  Llama2cConfig c{};
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  // INT32_MIN has no positive counterpart: leave it negative so validation rejects it.
  c.vocab_size = h[5] == INT32_MIN ? h[5] : std::abs(h[5]);
  c.seq_len = h[6];
  validate(c, path);
  Layout l = layout_of(c, path);
  uint64_t expected = uint64_t(l.total_floats() * 4 + kHeaderBytes);
  MT_CHECK(size >= expected, "[llama2c] ", path, ": file has ", size, " bytes but its header (", header_text(c),
           ") implies ", expected, " bytes: ", expected - size, " bytes missing (truncated?)");
  MT_CHECK(size == expected, "[llama2c] ", path, ": file has ", size, " bytes but its header (", header_text(c),
           ") implies ", expected, " bytes: ", size - expected,
           " unexpected trailing bytes (not a legacy llama2.c checkpoint, or another header)");

  // Each parameter is a view of the mapping (offsets are multiples of 4 after a 28-byte
  // header, so every f32 is aligned).
  uint64_t cursor = 0;  // in floats after the header
  auto take = [&](uint64_t count) {
    uint64_t at = cursor;
    cursor += count;
    return at;
  };
  auto view = [&](uint64_t at_float, const Shape& shape) {
    auto impl = std::make_shared<ArrayImpl>();
    impl->shape = shape;
    impl->dtype = DType::f32;
    impl->storage = std::shared_ptr<void>(file, file->data() + kHeaderBytes + at_float * 4);
    return Array(std::move(impl)).to(current_device());
  };
  const int64_t D = c.dim, F = c.hidden_dim, V = c.vocab_size, hd = c.head_dim(), KV = int64_t(c.n_kv_heads) * hd;
  const int L = c.n_layers;
  // Per-layer blocks are stacked [layer][...]: layer i of a block of n floats starts at i * n / L.
  auto layered = [&](uint64_t block_start, uint64_t block_floats, int i, const Shape& shape) {
    return view(block_start + uint64_t(i) * (block_floats / uint64_t(L)), shape);
  };

  Llama2cCheckpoint ck;
  ck.config = c;
  uint64_t emb = take(l.emb), rms_att = take(l.rms_att), wq = take(l.wq), wk = take(l.wk), wv = take(l.wv),
           wo = take(l.wo), rms_ffn = take(l.rms_ffn), w1 = take(l.w1), w2 = take(l.w2), w3 = take(l.w3),
           rms_final = take(l.rms_final), freq_real = take(l.freq), freq_imag = take(l.freq), wcls = take(l.wcls);
  Array embedding = view(emb, {V, D});
  Params& p = ck.params;
  p.set("model.embed_tokens.weight", embedding);
  for (int i = 0; i < L; ++i) {
    p.set(layer_key(i, "self_attn.q_proj.weight"), layered(wq, l.wq, i, {D, D}));
    p.set(layer_key(i, "self_attn.k_proj.weight"), layered(wk, l.wk, i, {KV, D}));
    p.set(layer_key(i, "self_attn.v_proj.weight"), layered(wv, l.wv, i, {KV, D}));
    p.set(layer_key(i, "self_attn.o_proj.weight"), layered(wo, l.wo, i, {D, D}));
    p.set(layer_key(i, "mlp.gate_proj.weight"), layered(w1, l.w1, i, {F, D}));
    p.set(layer_key(i, "mlp.up_proj.weight"), layered(w3, l.w3, i, {F, D}));
    p.set(layer_key(i, "mlp.down_proj.weight"), layered(w2, l.w2, i, {D, F}));
    p.set(layer_key(i, "input_layernorm.weight"), layered(rms_att, l.rms_att, i, {D}));
    p.set(layer_key(i, "post_attention_layernorm.weight"), layered(rms_ffn, l.rms_ffn, i, {D}));
  }
  p.set("model.norm.weight", view(rms_final, {D}));
  p.set("lm_head.weight", c.shared_classifier ? embedding : view(wcls, {V, D}));
  ck.freq_cis_real = view(freq_real, {int64_t(c.seq_len), hd / 2});
  ck.freq_cis_imag = view(freq_imag, {int64_t(c.seq_len), hd / 2});
  return ck;
}

void save_llama2c(const std::string& path, const Llama2cConfig& c, const Params& params) {
  validate(c, path);
  Layout l = layout_of(c, path);
  const int64_t D = c.dim, F = c.hidden_dim, V = c.vocab_size, hd = c.head_dim(), KV = int64_t(c.n_kv_heads) * hd;
  AtomicFileWriter w(path, "llama2c");
  int32_t h[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.shared_classifier ? c.vocab_size : -c.vocab_size,
                  c.seq_len};
  w.write(h, sizeof h);
  auto put = [&](const std::string& key, const Shape& shape) {
    MT_CHECK(params.contains(key), "[llama2c] ", path, ": missing parameter '", key, "'");
    const Array& a = params.at(key);
    MT_CHECK(a.shape() == shape, "[llama2c] ", path, ": parameter '", key, "' has shape ", a.shape().str(), ", expected ",
             shape.str());
    std::vector<float> v = a.to_floats();
    w.write(v.data(), v.size() * sizeof(float));
  };
  put("model.embed_tokens.weight", {V, D});
  auto per_layer = [&](const char* rest, const Shape& shape) {
    for (int i = 0; i < c.n_layers; ++i) put(layer_key(i, rest), shape);
  };
  per_layer("input_layernorm.weight", {D});
  per_layer("self_attn.q_proj.weight", {D, D});
  per_layer("self_attn.k_proj.weight", {KV, D});
  per_layer("self_attn.v_proj.weight", {KV, D});
  per_layer("self_attn.o_proj.weight", {D, D});
  per_layer("post_attention_layernorm.weight", {D});
  per_layer("mlp.gate_proj.weight", {F, D});
  per_layer("mlp.down_proj.weight", {D, F});
  per_layer("mlp.up_proj.weight", {F, D});
  put("model.norm.weight", {D});
  // freq_cis as model.py's precompute_freqs_cis: angle = pos * theta^(-2i / head_dim).
  std::vector<float> re(size_t(l.freq)), im(size_t(l.freq));
  for (int64_t pos = 0; pos < c.seq_len; ++pos)
    for (int64_t i = 0; i < hd / 2; ++i) {
      float inv = float(1.0 / std::pow(double(c.rope_theta), double(2 * i) / double(hd)));
      float angle = float(pos) * inv;
      re[size_t(pos * (hd / 2) + i)] = std::cos(angle);
      im[size_t(pos * (hd / 2) + i)] = std::sin(angle);
    }
  w.write(re.data(), re.size() * sizeof(float));
  w.write(im.data(), im.size() * sizeof(float));
  if (!c.shared_classifier) put("lm_head.weight", {V, D});
  MT_CHECK(w.bytes_written() == l.total_floats() * 4 + kHeaderBytes, "[llama2c] ", path, ": internal size mismatch");
  w.commit();
}

nlohmann::json llama2c_hf_config(const Llama2cConfig& c) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", c.dim},
          {"intermediate_size", c.hidden_dim},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_kv_heads},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.seq_len},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", c.shared_classifier},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"rotary_interleaved", c.rotary_interleaved}};
}

}  // namespace mt::io
