#pragma once
// A restricted unpickler for PyTorch checkpoints (pytorch_model.bin): the part of Python's
// pickle format that torch.save produces for a state dict, run as a small stack machine that
// executes nothing. Callable globals are an allow-list (the tensor rebuild functions and
// OrderedDict); storage classes may only name a storage's dtype. Any other global
// (os.system, builtins.eval, ...) is an error naming it, raised when the GLOBAL opcode is
// read, before anything could be called.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mt::io {

struct PickleValue;
using PickleRef = std::shared_ptr<PickleValue>;

struct PickleValue {
  enum class Kind { none, boolean, integer, floating, string, bytes, tuple, list, dict, global, storage, tensor };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  double floating = 0;
  std::string text;                                  // string, bytes; global: "module.name"; storage: its key
  std::vector<PickleRef> items;                      // tuple, list
  std::vector<std::pair<PickleRef, PickleRef>> entries;  // dict, in insertion order
  // storage: dtype (safetensors name: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL) and element count
  std::string dtype;
  int64_t numel = 0;
  // tensor: a view of `storage`
  PickleRef storage;
  int64_t offset = 0;
  std::vector<int64_t> shape, stride;

  std::string describe() const;  // "dict", "tuple of 3", "global 'os.system'", ... for errors
};

// The safetensors dtype name of a torch storage class ("torch.FloatStorage" -> "F32"), or "".
std::string torch_storage_dtype(const std::string& global_name);

// Unpickles one pickle from the start of `bytes`. `persistent_load` turns a persistent id
// (BINPERSID) into a value (torch: a storage). `consumed` receives the pickle's length (a
// legacy torch file holds several pickles in a row). Errors name `where` and the offset.
PickleRef unpickle(std::string_view bytes, const std::string& where,
                   const std::function<PickleRef(const PickleRef& pid)>& persistent_load, size_t* consumed = nullptr);

}  // namespace mt::io
