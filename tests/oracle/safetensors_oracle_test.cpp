// safetensors against an independent implementation: Python (struct + json + numpy/torch,
// no safetensors module in torch 1.13) writes files by hand that we read, reads the files
// we write, and reads the real HF files in ../shared/data for a value-by-value comparison.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>

#include "meshtrain/meshtrain.h"
#include "tests/support/op_check.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using testing::OracleResult;
using testing::TorchOracle;

// A Python reader/writer of the format, sharing nothing with ours.
const char* kPythonFormat = R"PY(
import json, struct
import numpy as np
import torch

NP = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'I64': np.int64, 'I32': np.int32,
      'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}

def st_write(path, tensors, metadata=None):
    header, blobs, pos = {}, [], 0
    if metadata: header['__metadata__'] = metadata
    for name, (dtype, t) in tensors.items():
        b = (t.view(torch.int16).numpy() if dtype == 'BF16' else t.numpy()).tobytes()
        header[name] = {'dtype': dtype, 'shape': list(t.shape), 'data_offsets': [pos, pos + len(b)]}
        blobs.append(b); pos += len(b)
    h = json.dumps(header).encode()
    h += b' ' * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h))); f.write(h)
        for b in blobs: f.write(b)

def st_read(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop('__metadata__', {})
    data = raw[8 + n:]
    spans = sorted(tuple(v['data_offsets']) for v in header.values())
    pos = 0
    for b, e in spans:
        assert b == pos, ('hole or overlap', b, pos)
        pos = e
    assert pos == len(data), ('trailing bytes', pos, len(data))
    out = {}
    for name, v in header.items():
        b, e = v['data_offsets']
        if v['dtype'] == 'BF16':
            t = torch.from_numpy(np.frombuffer(data[b:e], dtype=np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.frombuffer(data[b:e], dtype=NP[v['dtype']]).copy())
        out[name] = (v['dtype'], t.reshape(v['shape']), b)
    return header, meta, out, 8 + n
)PY";

class SafetensorsOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_safetensors_oracle_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

void expect_equal_values(const Array& ours, const testing::OracleTensor& ref, const std::string& label) {
  ASSERT_EQ(ours.shape().dims(), ref.shape) << label;
  std::vector<double> v = ours.to_doubles();
  double max_err = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i]) && std::isnan(ref.data[i])) continue;
    max_err = std::max(max_err, std::abs(v[i] - ref.data[i]));
  }
  std::cout << "  " << label << " " << ours.str() << " max error " << max_err << "\n";
  EXPECT_EQ(max_err, 0.0) << label;
}

TEST_F(SafetensorsOracle, ReadsAFileWrittenByPython) {
  std::string path = (dir_ / "py.safetensors").string();
  std::string code = std::string(kPythonFormat) + R"PY(
g = torch.Generator().manual_seed(0)
ts = {
  'a.f32': ('F32', torch.randn(3, 5, generator=g)),
  'b.bf16': ('BF16', torch.randn(4, 3, generator=g).bfloat16()),
  'c.f16': ('F16', torch.randn(7, generator=g).half()),
  'd.i32': ('I32', torch.randint(-1000, 1000, (2, 3), generator=g, dtype=torch.int32)),
  'e.i64': ('I64', torch.randint(-10**12, 10**12, (5,), generator=g)),
  'f.bool': ('BOOL', torch.rand(9, generator=g) > 0.5),
  'g.f64': ('F64', torch.randn(3, generator=g, dtype=torch.float64)),
  'h.i8': ('I8', torch.randint(-128, 128, (6,), generator=g, dtype=torch.int8)),
  'i.u8': ('U8', torch.randint(0, 256, (5,), generator=g, dtype=torch.uint8)),
  'j.i16': ('I16', torch.randint(-30000, 30000, (3,), generator=g, dtype=torch.int16)),
}
st_write(')PY" + path + R"PY(', ts, {'format': 'pt', 'note': 'written by hand'})
out = [t.double() if d != 'F64' else t.float().double() for d, t in ts.values()]
)PY";
  OracleResult ref = TorchOracle::instance().run(code, {});
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  ASSERT_EQ(f.keys().size(), ref.outputs.size());
  EXPECT_EQ(f.metadata().at("note"), "written by hand");
  for (size_t i = 0; i < f.keys().size(); ++i) {
    const std::string& k = f.keys()[i];
    expect_equal_values(f.get(k), ref.outputs[i], k + " (" + f.info(k).file_dtype + ")");
  }
  EXPECT_EQ(f.get("g.f64").dtype(), DType::f32);
  EXPECT_EQ(f.get("h.i8").dtype(), DType::i32);
}

TEST_F(SafetensorsOracle, PythonReadsOurFiles) {
  Params p;
  p.set("flag", Array::from_vector(std::vector<int64_t>{1, 0, 1}, {3}, DType::boolean));
  p.set("w", testing::random_normal({4, 6}, 1));
  p.set("w_bf16", testing::random_normal({5, 3}, 2, DType::bf16));
  p.set("w_f16", testing::random_normal({3}, 3, DType::f16));
  p.set("ids", testing::random_ints({7}, 4, -5, 5, DType::i32));
  p.set("pos", testing::random_ints({2, 2}, 5, 0, 1000000, DType::i64));
  p.set("s", Array::scalar(2.5));
  std::string path = (dir_ / "ours.safetensors").string();
  io::save_safetensors(path, p, {{"format", "pt"}, {"step", "3"}});
  std::string code = std::string(kPythonFormat) + R"PY(
header, meta, ts, start = st_read(')PY" + path + R"PY(')
assert meta == {'format': 'pt', 'step': '3'}, meta
assert start % 8 == 0, start
assert list(header.keys()) == ['flag', 'w', 'w_bf16', 'w_f16', 'ids', 'pos', 's'], list(header.keys())
for name, (d, t, b) in ts.items():
    assert b % t.element_size() == 0, (name, b)
out = [t.double() for d, t, b in ts.values()]
)PY";
  OracleResult ref = TorchOracle::instance().run(code, {});
  ASSERT_EQ(ref.outputs.size(), p.size());
  size_t i = 0;
  for (const auto& [name, a] : p) expect_equal_values(a, ref.outputs[i++], name);
}

TEST_F(SafetensorsOracle, RealHfFilesMatchAnIndependentReader) {
  for (const char* model : {"hf-tiny-bert", "hf-tiny-gpt2"}) {
    std::string path = std::string(MT_DATA_DIR) + "/models/" + model + "/model.safetensors";
    std::string code = std::string(kPythonFormat) + "header, meta, ts, start = st_read('" + path +
                       "')\nout = [t.double() for d, t, b in ts.values()]\n";
    OracleResult ref = TorchOracle::instance().run(code, {});
    io::SafetensorsFile f = io::SafetensorsFile::open(path);
    ASSERT_EQ(f.keys().size(), ref.outputs.size()) << model;
    double worst = 0;
    for (size_t i = 0; i < f.keys().size(); ++i) {
      Array a = f.get(f.keys()[i]);
      ASSERT_EQ(a.shape().dims(), ref.outputs[i].shape) << f.keys()[i];
      std::vector<double> v = a.to_doubles();
      for (size_t j = 0; j < v.size(); ++j) worst = std::max(worst, std::abs(v[j] - ref.outputs[i].data[j]));
    }
    std::cout << "  " << model << ": " << f.keys().size() << " tensors, max error " << worst << "\n";
    EXPECT_EQ(worst, 0.0);
  }
}

// llama2.c: numpy walks stories260K in export.py's legacy order; our named views must match.
TEST(Llama2cOracle, Stories260KMatchesANumpyReader) {
  std::string path = std::string(MT_DATA_DIR) + "/models/stories260K/stories260K.bin";
  std::string code = R"PY(
import struct
import numpy as np
import torch
raw = open(')PY" + path + R"PY(', 'rb').read()
dim, hidden, L, H, KV, V, S = struct.unpack('7i', raw[:28])
w = np.frombuffer(raw[28:], dtype=np.float32)
hd = dim // H
pos = 0
def take(*shape):
    global pos
    n = int(np.prod(shape)); t = w[pos:pos + n].reshape(shape); pos += n; return t
emb = take(abs(V), dim); att = take(L, dim); wq = take(L, dim, dim); wk = take(L, KV * hd, dim)
wv = take(L, KV * hd, dim); wo = take(L, dim, dim); ffn = take(L, dim); w1 = take(L, hidden, dim)
w2 = take(L, dim, hidden); w3 = take(L, hidden, dim); norm = take(dim); take(S, hd // 2); take(S, hd // 2)
assert pos == len(w)
out = [torch.from_numpy(x.astype(np.float64)) for x in (emb, att[1], wq[2], wk[3], wv[4], wo[0], ffn[2], w1[1], w2[4], w3[3], norm)]
)PY";
  OracleResult ref = TorchOracle::instance().run(code, {});
  io::Llama2cCheckpoint ck = io::load_llama2c(path);
  const char* names[] = {"model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
                         "model.layers.2.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                         "model.layers.4.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                         "model.layers.2.post_attention_layernorm.weight", "model.layers.1.mlp.gate_proj.weight",
                         "model.layers.4.mlp.down_proj.weight", "model.layers.3.mlp.up_proj.weight", "model.norm.weight"};
  ASSERT_EQ(ref.outputs.size(), std::size(names));
  for (size_t i = 0; i < std::size(names); ++i) expect_equal_values(ck.params.at(names[i]), ref.outputs[i], names[i]);
}

}  // namespace
}  // namespace mt
