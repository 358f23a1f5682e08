#pragma once
// safetensors (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the
// byte buffer that the offsets (relative to its start) tile without gaps or overlaps.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/core/array.h"

namespace mt::io {

class MappedFile;

struct TensorInfo {
  DType dtype;             // what get() returns (F64 -> f32, small ints -> i32/i64, F8 -> f32)
  Shape shape;
  size_t begin, end;       // data_offsets as in the header: relative to the byte buffer
  std::string file_dtype;  // the header's dtype string ("F32", "BF16", "U8", ...)
};

class SafetensorsFile {
 public:
  // Maps the file and validates the header, every entry and the offsets' tiling of the
  // buffer; errors are "[safetensors] <path>: ..." and name the tensor at fault.
  static SafetensorsFile open(const std::string& path);

  const std::vector<std::string>& keys() const { return keys_; }  // header order
  bool contains(const std::string& key) const { return index_.count(key) > 0; }
  const TensorInfo& info(const std::string& key) const;  // throws naming the key and the file
  // Zero-copy when the file dtype is an engine dtype (F32/BF16/F16/I32/I64/BOOL) and the
  // data is aligned to its element size: the Array's storage aliases the mapping, which
  // it keeps alive. Other dtypes (and misaligned data) are converted/copied.
  Array get(const std::string& key) const;
  Params get_all() const;  // every tensor, in header order
  // Drops the mapped pages of `key`'s bytes from this process (the page cache keeps them; a
  // later read maps them again): a reader that copies tensors out one by one then holds one
  // tensor of the file resident, not every tensor read so far. For read-only use: a change
  // written through an Array aliasing those bytes is dropped with them.
  void release(const std::string& key) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  size_t data_start() const { return data_start_; }  // file offset of the byte buffer
  size_t file_size() const;
  const void* mapping() const;  // the mapped bytes of the whole file (for zero-copy checks)

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  size_t data_start_ = 0;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, TensorInfo> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (host arrays; a sharded array throws: gather it with dist::to_host
// first) atomically: temp file in the same directory, fsync, rename. Header keys follow
// Params order; data offsets are 8-byte aligned (the header is space-padded, tensors are
// laid out by decreasing element size, stable, so the buffer has no holes and every
// tensor is aligned — the layout the reference implementation requires and produces).
void save_safetensors(const std::string& path, const Params& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes `dir`/model-0000i-of-0000N.safetensors shards of at most `max_shard_bytes` of
// tensor data each (a larger single tensor gets its own shard) plus
// model.safetensors.index.json; returns the shard file names. One shard still gets an index.
std::vector<std::string> save_safetensors_sharded(const std::string& dir, const Params& tensors,
                                                  size_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata = {});

// A .safetensors file, a model.safetensors.index.json, or a directory holding
// model.safetensors or a sharded model.safetensors.index.json (weight_map -> shard files).
// Tensors are zero-copy where possible (see SafetensorsFile::get).
Params load_safetensors(const std::string& path);

// safetensors dtype string <-> engine dtype for the dtypes the engine has.
const char* safetensors_dtype_name(DType dtype);
// A fresh array from `shape.numel()` elements of safetensors dtype `dtype` ("F32", "F64",
// "I8", ...) at `src` (any alignment), converted as load_safetensors converts; `where`
// names the tensor in errors. Other readers of raw tensor bytes (PyTorch .bin) share it.
Array tensor_from_bytes(const uint8_t* src, const std::string& dtype, const Shape& shape, const std::string& where);
// Bytes per element of a safetensors dtype, 0 when unknown.
size_t safetensors_dtype_size(const std::string& dtype);

}  // namespace mt::io
