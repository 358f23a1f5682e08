#include "meshtrain/io/safetensors.h"
#include "meshtrain/io/sharded_index.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/io/safetensors_writer.h"

namespace mt::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors and llama2.c files are little-endian; a big-endian host needs byte swaps");

namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

// The reference implementation rejects larger headers too; real ones are a few MB at most.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// One safetensors dtype: its element size and the engine dtype get() returns. `native`
// types are returned zero-copy; the others are converted element by element.
struct FileDType {
  const char* name;
  size_t size;
  DType engine;
  bool native;
};
constexpr FileDType kFileDTypes[] = {
    {"F32", 4, DType::f32, true},       {"BF16", 2, DType::bf16, true},     {"F16", 2, DType::f16, true},
    {"I32", 4, DType::i32, true},       {"I64", 8, DType::i64, true},       {"BOOL", 1, DType::boolean, true},
    {"F64", 8, DType::f32, false},      {"I8", 1, DType::i32, false},       {"U8", 1, DType::i32, false},
    {"I16", 2, DType::i32, false},      {"U16", 2, DType::i32, false},      {"U32", 4, DType::i64, false},
    {"U64", 8, DType::i64, false},      {"F8_E4M3", 1, DType::f32, false},  {"F8_E5M2", 1, DType::f32, false},
};

const FileDType* find_file_dtype(const std::string& name) {
  for (const FileDType& d : kFileDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string known_dtype_list() {
  std::string s;
  for (const FileDType& d : kFileDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// OCP FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN), bias 7.
float f8_e4m3_to_f32(uint8_t b) {
  int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) v = std::numeric_limits<float>::quiet_NaN();
  else if (exp == 0) v = std::ldexp(float(man) / 8.0f, -6);
  else v = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return sign ? -v : v;
}
// FP8 E5M2 is the upper byte of an IEEE half.
float f8_e5m2_to_f32(uint8_t b) { return f16_to_f32(f16{uint16_t(uint16_t(b) << 8)}); }

template <class T>
T load_unaligned(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Copies (and converts) `n` elements of file dtype `fd` at `src` into a fresh array.
Array convert_copy(const uint8_t* src, const FileDType& fd, const Shape& shape, const std::string& where) {
  Array out = Array::empty(shape, fd.engine, Device::cpu());  // filled on the host, then placed
  size_t n = size_t(shape.numel());
  std::string name = fd.name;
  if (fd.native) {
    std::memcpy(out.raw(), src, n * fd.size);
    if (fd.engine == DType::boolean) {  // normalize: a bool byte other than 0/1 is UB in C++
      auto* b = static_cast<uint8_t*>(out.raw());
      for (size_t i = 0; i < n; ++i) b[i] = b[i] != 0;
    }
  } else if (name == "F64") {
    float* o = out.data<float>();
    for (size_t i = 0; i < n; ++i) o[i] = float(load_unaligned<double>(src + 8 * i));
  } else if (name == "F8_E4M3" || name == "F8_E5M2") {
    float* o = out.data<float>();
    bool e4 = name == "F8_E4M3";
    for (size_t i = 0; i < n; ++i) o[i] = e4 ? f8_e4m3_to_f32(src[i]) : f8_e5m2_to_f32(src[i]);
  } else if (name == "I8" || name == "U8" || name == "I16" || name == "U16") {
    int32_t* o = out.data<int32_t>();
    for (size_t i = 0; i < n; ++i) {
      if (name == "I8") o[i] = int8_t(src[i]);
      else if (name == "U8") o[i] = src[i];
      else if (name == "I16") o[i] = load_unaligned<int16_t>(src + 2 * i);
      else o[i] = load_unaligned<uint16_t>(src + 2 * i);
    }
  } else if (name == "U32") {
    int64_t* o = out.data<int64_t>();
    for (size_t i = 0; i < n; ++i) o[i] = load_unaligned<uint32_t>(src + 4 * i);
  } else if (name == "U64") {
    int64_t* o = out.data<int64_t>();
    for (size_t i = 0; i < n; ++i) {
      uint64_t v = load_unaligned<uint64_t>(src + 8 * i);
      MT_CHECK(v <= uint64_t(std::numeric_limits<int64_t>::max()), "[safetensors] ", where, ": U64 element ", i,
               " = ", v, " does not fit the engine's i64");
      o[i] = int64_t(v);
    }
  } else {
    throw Error(detail::concat("[safetensors] ", where, ": no conversion for dtype ", name));
  }
  return out.to(current_device());
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

Array tensor_from_bytes(const uint8_t* src, const std::string& dtype, const Shape& shape, const std::string& where) {
  const FileDType* fd = find_file_dtype(dtype);
  MT_CHECK(fd != nullptr, "[safetensors] ", where, ": unknown dtype '", dtype, "' (known: ", known_dtype_list(), ")");
  return convert_copy(src, *fd, shape, where);
}

size_t safetensors_dtype_size(const std::string& dtype) {
  const FileDType* fd = find_file_dtype(dtype);
  return fd ? fd->size : 0;
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  throw Error("[safetensors] invalid dtype");
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile st;
  st.path_ = path;
  st.file_ = MappedFile::open(path, "safetensors");
  const uint8_t* base = st.file_->data();
  const size_t size = st.file_->size();
  auto err = [&](const auto&... parts) { return Error(detail::concat("[safetensors] ", path, ": ", parts...)); };

  if (size < 8) throw err("file has ", size, " bytes, too short for the 8-byte header length");
  uint64_t n = load_unaligned<uint64_t>(base);
  if (n > size - 8) throw err("header length ", n, " exceeds the ", size - 8, " bytes after the length field (file size ", size, ")");
  if (n > kMaxHeaderBytes) throw err("header length ", n, " exceeds the ", kMaxHeaderBytes, "-byte limit");
  if (n == 0 || base[8] != '{') throw err("header does not start with '{' (not a safetensors file?)");

  // Duplicate top-level keys would silently shadow each other in the DOM: catch them while parsing.
  std::string duplicate;
  std::set<std::string> seen;
  ordered_json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event, ordered_json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
      std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  ordered_json header;
  try {
    header = ordered_json::parse(base + 8, base + 8 + n, cb);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    size_t p = what.find("] ");
    throw err("invalid JSON header: ", p == std::string::npos ? what : what.substr(p + 2));
  }
  if (!duplicate.empty()) throw err("duplicate key '", duplicate, "' in the header");
  if (!header.is_object()) throw err("header is not a JSON object");

  st.data_start_ = size_t(8 + n);
  const size_t data_len = size - st.data_start_;
  struct Range {
    size_t begin, end;
    const std::string* key;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const ordered_json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) throw err("__metadata__ must be an object of strings, got ", v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m->is_string()) throw err("__metadata__ value of '", m.key(), "' must be a string, got ", m->type_name());
        st.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    auto terr = [&](const auto&... parts) { return err("tensor '", key, "': ", parts...); };
    if (!v.is_object()) throw terr("entry must be an object, got ", v.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) throw terr("missing '", field, "'");
    if (!v["dtype"].is_string()) throw terr("dtype must be a string");
    std::string dtype_name = v["dtype"].get<std::string>();
    const FileDType* fd = find_file_dtype(dtype_name);
    if (fd == nullptr) throw terr("unknown or unsupported dtype '", dtype_name, "' (supported: ", known_dtype_list(), ")");

    const ordered_json& js = v["shape"];
    if (!js.is_array()) throw terr("shape must be an array of non-negative integers");
    std::vector<int64_t> dims;
    uint64_t numel = 1;
    for (const ordered_json& d : js) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        throw terr("shape ", js.dump(), " must hold non-negative integers");
      uint64_t dv = d.get<uint64_t>();
      if (mul_overflows(numel, dv, &numel)) throw terr("shape ", js.dump(), " overflows");
      dims.push_back(int64_t(dv));
    }
    uint64_t nbytes;
    if (mul_overflows(numel, fd->size, &nbytes) || numel > uint64_t(std::numeric_limits<int64_t>::max()))
      throw terr("shape ", js.dump(), " overflows");

    const ordered_json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      throw terr("data_offsets must be [begin, end] with non-negative integers, got ", jo.dump());
    uint64_t b = jo[0].get<uint64_t>(), e = jo[1].get<uint64_t>();
    if (b > e) throw terr("data_offsets [", b, ", ", e, "] are out of order (begin > end)");
    if (e > data_len)
      throw terr("data_offsets [", b, ", ", e, "] run past the end of the data (", data_len, " bytes after the ", n,
                 "-byte header; file size ", size, ")");
    if (e - b != nbytes)
      throw terr("shape ", Shape(dims).str(), " of ", dtype_name, " needs ", nbytes, " bytes but data_offsets [", b,
                 ", ", e, "] span ", e - b);

    st.keys_.push_back(key);
    st.index_.emplace(key, TensorInfo{fd->engine, Shape(std::move(dims)), size_t(b), size_t(e), dtype_name});
  }
  for (const std::string& k : st.keys_) {
    const TensorInfo& ti = st.index_.at(k);
    ranges.push_back({ti.begin, ti.end, &k});
  }
  // The offsets must tile the buffer exactly (no overlap: no aliasing tensors; no holes:
  // no hidden payload), as the format specifies.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  size_t pos = 0;
  const std::string* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin < pos)
      throw err("tensor '", *r.key, "' data_offsets [", r.begin, ", ", r.end, "] overlap those of '", *prev,
                "' (which end at ", pos, ")");
    if (r.begin > pos)
      throw err("hole of ", r.begin - pos, " bytes in the data before tensor '", *r.key, "' (offsets [", r.begin,
                ", ", r.end, "], previous data ends at ", pos, ")");
    pos = r.end;
    prev = r.key;
  }
  if (pos != data_len)
    throw err(data_len - pos, " bytes after the last tensor's data are not covered by any tensor (data ends at ", pos,
              ", file has ", data_len, " data bytes)");
  return st;
}

const TensorInfo& SafetensorsFile::info(const std::string& key) const {
  auto it = index_.find(key);
  MT_CHECK(it != index_.end(), "[safetensors] ", path_, ": no tensor named '", key, "' (the file has ", keys_.size(),
           " tensors)");
  return it->second;
}

size_t SafetensorsFile::file_size() const { return file_->size(); }
const void* SafetensorsFile::mapping() const { return file_->data(); }

void SafetensorsFile::release(const std::string& key) const {
  const TensorInfo& ti = info(key);
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t base = reinterpret_cast<uintptr_t>(mapping()) + data_start_;
  // Whole pages inside the tensor's bytes only: its neighbours' pages stay.
  const uintptr_t begin = (base + ti.begin + page - 1) / page * page, end = (base + ti.end) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Array SafetensorsFile::get(const std::string& key) const {
  const TensorInfo& ti = info(key);
  const FileDType* fd = find_file_dtype(ti.file_dtype);
  if (ti.shape.numel() == 0) return Array::empty(ti.shape, ti.dtype);
  uint8_t* p = file_->data() + data_start_ + ti.begin;
  bool aliasable = fd->native && reinterpret_cast<uintptr_t>(p) % fd->size == 0;
  if (aliasable && fd->engine == DType::boolean) {
    for (size_t i = 0, n = ti.end - ti.begin; i < n && aliasable; ++i) aliasable = p[i] <= 1;
  }
  if (!aliasable) return convert_copy(p, *fd, ti.shape, path_ + ": tensor '" + key + "'");
  auto impl = std::make_shared<ArrayImpl>();
  impl->shape = ti.shape;
  impl->dtype = ti.dtype;
  // Aliasing constructor: the storage points into the mapping and owns a reference to it.
  impl->storage = std::shared_ptr<void>(file_, p);
  return Array(std::move(impl)).to(current_device());  // a GPU run copies it to the device
}

Params SafetensorsFile::get_all() const {
  Params out;
  for (const std::string& k : keys_) out.set(k, get(k));
  return out;
}

namespace {

void check_saveable(const std::string& path, const Params& tensors) {
  for (const auto& [name, a] : tensors) {
    MT_CHECK(!name.empty(), "[safetensors] ", path, ": empty tensor name");
    MT_CHECK(name != "__metadata__", "[safetensors] ", path, ": '__metadata__' is reserved and cannot name a tensor");
    MT_CHECK(a.defined(), "[safetensors] ", path, ": tensor '", name, "' is undefined");
    MT_CHECK(!a.sharded(), "[safetensors] ", path, ": tensor '", name, "' ", a.str(),
             " is sharded: gather it with dist::to_host first (or save per-rank shards)");
  }
}

}  // namespace

void save_safetensors(const std::string& path, const Params& tensors, const std::map<std::string, std::string>& metadata) {
  check_saveable(path, tensors);
  std::vector<TensorHeader> headers;
  std::vector<const Array*> values;
  for (const auto& [name, a] : tensors) {
    headers.push_back({name, a.dtype(), a.shape()});
    values.push_back(&a);
  }
  const std::vector<size_t> order = safetensors_data_order(headers);
  SafetensorsWriter w(path, std::move(headers), metadata);
  for (size_t i : order) w.write(*values[i]);
  w.commit();
}

std::vector<std::string> save_safetensors_sharded(const std::string& dir, const Params& tensors, size_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata) {
  check_saveable(dir, tensors);
  MT_CHECK(max_shard_bytes > 0, "[safetensors] ", dir, ": max_shard_bytes must be positive");
  std::vector<Params> shards(1);
  size_t in_shard = 0, total = 0;
  for (const auto& [name, a] : tensors) {
    if (in_shard > 0 && in_shard + a.nbytes() > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().set(name, a);
    in_shard += a.nbytes();
    total += a.nbytes();
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, "[safetensors] ", dir, ": cannot create the directory: ", ec.message());

  std::vector<std::string> names;
  ordered_json weight_map = ordered_json::object();
  char buf[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    names.push_back(buf);
    save_safetensors((fs::path(dir) / buf).string(), shards[i], metadata);
    for (const auto& e : shards[i]) weight_map[e.first] = buf;
  }
  ordered_json index = ordered_json::object();
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = std::move(weight_map);
  // The index goes last: a reader never sees an index naming shards not yet written.
  write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n", "safetensors");
  return names;
}

namespace {

Params read_safetensors_file(const std::string& path) { return SafetensorsFile::open(path).get_all(); }

}  // namespace

Params load_safetensors(const std::string& path) {
  std::error_code ec;
  fs::file_status s = fs::status(path, ec);
  MT_CHECK(fs::exists(s), "[safetensors] ", path, ": no such file or directory");
  if (fs::is_directory(s)) {
    fs::path single = fs::path(path) / "model.safetensors";
    fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(single)) return SafetensorsFile::open(single.string()).get_all();
    if (fs::exists(index)) return load_sharded_checkpoint(index.string(), read_safetensors_file, "safetensors");
    throw Error(detail::concat("[safetensors] ", path, ": the directory holds neither model.safetensors nor ",
                               "model.safetensors.index.json"));
  }
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
    return load_sharded_checkpoint(path, read_safetensors_file, "safetensors");
  return SafetensorsFile::open(path).get_all();
}

}  // namespace mt::io
