#include "meshtrain/io/torch_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/io/pickle.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/io/sharded_index.h"
#include "meshtrain/io/zip_reader.h"

namespace mt::io {
namespace {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

// torch's persistent id of a storage: ('storage', StorageClass, key, location, numel[, view]).
PickleRef storage_from_pid(const PickleRef& pid, const std::string& where) {
  MT_CHECK(pid->kind == Kind::tuple && pid->items.size() >= 5 && pid->items[0]->kind == Kind::string &&
               pid->items[0]->text == "storage" && pid->items[1]->kind == Kind::global &&
               pid->items[2]->kind == Kind::string && pid->items[4]->kind == Kind::integer,
           "[torch] ", where, ": a persistent id that is not a torch storage (", pid->describe(), ")");
  auto s = std::make_shared<PickleValue>();
  s->kind = Kind::storage;
  s->dtype = torch_storage_dtype(pid->items[1]->text);
  s->text = pid->items[2]->text;
  s->numel = pid->items[4]->integer;
  MT_CHECK(!s->dtype.empty(), "[torch] ", where, ": storage class '", pid->items[1]->text, "' is not supported");
  MT_CHECK(s->numel >= 0, "[torch] ", where, ": storage '", s->text, "' has ", s->numel, " elements");
  return s;
}

// The state dict's tensors, each copied out of its storage's bytes.
Params tensors_of(const PickleRef& root, const std::unordered_map<std::string, std::string_view>& storages,
                  const std::string& where) {
  MT_CHECK(root->kind == Kind::dict, "[torch] ", where, ": expected a state dict (name -> tensor), found a ",
           root->describe());
  Params out;
  for (const auto& [k, v] : root->entries) {
    MT_CHECK(k->kind == Kind::string, "[torch] ", where, ": a state dict key is a ", k->describe());
    MT_CHECK(v->kind == Kind::tensor, "[torch] ", where, ": '", k->text, "' is a ", v->describe(), ", not a tensor");
    const PickleValue& st = *v->storage;
    const std::string name = where + ": tensor '" + k->text + "'";
    auto bytes = storages.find(st.text);
    MT_CHECK(bytes != storages.end(), "[torch] ", name, ": its storage '", st.text, "' is missing from the file");
    const size_t elem = safetensors_dtype_size(st.dtype);
    MT_CHECK(bytes->second.size() >= size_t(st.numel) * elem, "[torch] ", name, ": storage '", st.text, "' holds ",
             bytes->second.size(), " bytes, fewer than its ", st.numel, " elements (truncated file?)");
    std::vector<int64_t> dims = v->shape;
    int64_t numel = 1, last = v->offset;
    bool contiguous = true;
    int64_t expect = 1;
    for (size_t i = dims.size(); i-- > 0;) {
      MT_CHECK(dims[i] >= 0 && v->stride[i] >= 0, "[torch] ", name, ": negative size or stride");
      numel *= dims[i];
      if (dims[i] > 1 && v->stride[i] != expect) contiguous = false;
      expect *= dims[i];
      if (dims[i] > 0) last += (dims[i] - 1) * v->stride[i];
    }
    MT_CHECK(numel == 0 || (v->offset >= 0 && last < st.numel), "[torch] ", name, ": its view (offset ", v->offset,
             ") reaches past the ", st.numel, " elements of its storage");
    const auto* base = reinterpret_cast<const uint8_t*>(bytes->second.data());
    if (contiguous || numel == 0) {
      out.set(k->text, tensor_from_bytes(base + size_t(v->offset) * elem, st.dtype, Shape(dims), name));
      continue;
    }
    // A strided view (a transposed or sliced tensor saved as is): gather it row-major.
    std::vector<uint8_t> packed(size_t(numel) * elem);
    std::vector<int64_t> index(dims.size(), 0);
    for (int64_t n = 0; n < numel; ++n) {
      int64_t at = v->offset;
      for (size_t d = 0; d < dims.size(); ++d) at += index[d] * v->stride[d];
      std::memcpy(packed.data() + size_t(n) * elem, base + size_t(at) * elem, elem);
      for (size_t d = dims.size(); d-- > 0;)
        if (++index[d] < dims[d]) break;
        else index[d] = 0;
    }
    out.set(k->text, tensor_from_bytes(packed.data(), st.dtype, Shape(dims), name));
  }
  return out;
}

Params load_zip(const std::string& path) {
  ZipReader zip(path);
  std::string prefix;
  for (const auto& n : zip.names())
    if (n.size() >= 8 && n.compare(n.size() - 8, 8, "data.pkl") == 0) prefix = n.substr(0, n.size() - 8);
  auto pkl = zip.find(prefix + "data.pkl");
  MT_CHECK(pkl.has_value(), "[torch] ", path, ": a zip archive without data.pkl (not a torch.save file)");
  if (auto order = zip.find(prefix + "byteorder"))
    MT_CHECK(*order == "little", "[torch] ", path, ": byte order '", std::string(*order), "' is not supported");
  std::unordered_map<std::string, std::string_view> storages;
  const PickleRef root = unpickle(*pkl, path + " (" + prefix + "data.pkl)", [&](const PickleRef& pid) {
    PickleRef s = storage_from_pid(pid, path);
    if (!storages.count(s->text)) {
      auto bytes = zip.find(prefix + "data/" + s->text);
      MT_CHECK(bytes.has_value(), "[torch] ", path, ": storage '", s->text, "' has no entry ", prefix, "data/", s->text);
      storages.emplace(s->text, *bytes);
    }
    return s;
  });
  return tensors_of(root, storages, path);
}

// Before PyTorch 1.6: pickles of the magic number, the protocol version and system info,
// then the object, then the list of storage keys, then each storage as an int64 element
// count followed by its bytes.
Params load_legacy(const std::string& path) {
  auto file = MappedFile::open(path, "torch");
  const std::string_view all(reinterpret_cast<const char*>(file->data()), file->size());
  // pickle(0x1950a86a20f9469cfc6c) with protocol 2: a 10-byte LONG1.
  static const std::string_view kMagic("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e", 15);
  if (all.substr(0, kMagic.size()) != kMagic) {
    // Not torch's legacy header: run the unpickler anyway, so a malicious pickle is named.
    unpickle(all, path, nullptr);
    throw Error(detail::concat("[torch] ", path, ": neither a zip archive nor a legacy torch.save file (no magic number)"));
  }
  size_t at = kMagic.size(), used = 0;
  const PickleRef version = unpickle(all.substr(at), path, nullptr, &used);
  at += used;
  MT_CHECK(version->kind == Kind::integer && version->integer == 1001, "[torch] ", path,
           ": legacy protocol version ", version->describe(), " (expected 1001)");
  const PickleRef sys_info = unpickle(all.substr(at), path, nullptr, &used);
  at += used;
  for (const auto& [k, v] : sys_info->entries)
    if (k->kind == Kind::string && k->text == "little_endian")
      MT_CHECK(v->kind == Kind::boolean && v->boolean, "[torch] ", path, ": a big-endian checkpoint is not supported");
  std::vector<PickleRef> storages_seen;
  const PickleRef root = unpickle(all.substr(at), path, [&](const PickleRef& pid) {
    PickleRef s = storage_from_pid(pid, path);
    storages_seen.push_back(s);
    return s;
  }, &used);
  at += used;
  const PickleRef keys = unpickle(all.substr(at), path, nullptr, &used);
  at += used;
  MT_CHECK(keys->kind == Kind::list, "[torch] ", path, ": expected the list of storage keys, found a ", keys->describe());
  std::unordered_map<std::string, std::string> dtype_of;
  for (const auto& s : storages_seen) dtype_of[s->text] = s->dtype;
  std::unordered_map<std::string, std::string_view> storages;
  for (const auto& key : keys->items) {
    MT_CHECK(key->kind == Kind::string && dtype_of.count(key->text), "[torch] ", path, ": storage key ", key->describe(),
             " is not used by the state dict");
    MT_CHECK(at + 8 <= all.size(), "[torch] ", path, ": truncated before storage '", key->text, "'");
    int64_t n;
    std::memcpy(&n, all.data() + at, 8);
    at += 8;
    const uint64_t bytes = uint64_t(n) * safetensors_dtype_size(dtype_of[key->text]);
    MT_CHECK(n >= 0 && bytes <= all.size() - at, "[torch] ", path, ": storage '", key->text, "' (", n,
             " elements) runs past the end of the file (truncated?)");
    storages.emplace(key->text, all.substr(at, size_t(bytes)));
    at += size_t(bytes);
  }
  return tensors_of(root, storages, path);
}

}  // namespace

Params load_torch_checkpoint(const std::string& path) {
  MT_CHECK(fs::is_regular_file(path), "[torch] ", path, ": no such file");
  return ZipReader::looks_like_zip(path) ? load_zip(path) : load_legacy(path);
}

Params load_torch_checkpoint_dir(const std::string& dir) {
  const fs::path single = fs::path(dir) / "pytorch_model.bin", index = fs::path(dir) / "pytorch_model.bin.index.json";
  if (fs::exists(single)) return load_torch_checkpoint(single.string());
  MT_CHECK(fs::exists(index), "[torch] ", dir, ": neither pytorch_model.bin nor pytorch_model.bin.index.json");
  return load_sharded_checkpoint(index.string(), load_torch_checkpoint, "torch");
}

}  // namespace mt::io
