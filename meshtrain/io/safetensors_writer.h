#pragma once
// A safetensors file written tensor by tensor (issue 50): the header needs only each tensor's
// name, dtype and shape, so it is written first and the bytes follow one tensor at a time. A
// caller that gathers or converts each tensor just before writing it then holds one tensor,
// not a copy of the whole model (the exported model of a sharded run; Orbax and PyTorch's DCP
// stream their saves the same way). save_safetensors writes through it, so both paths give
// the same bytes.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/array.h"

namespace mt::io {

class AtomicFileWriter;

// What a safetensors header says of a tensor before its bytes exist.
struct TensorHeader {
  std::string name;
  DType dtype;
  Shape shape;
};

// The order of the tensors' bytes in the file (indices into `tensors`): larger elements first,
// otherwise as given, so that every tensor starts at a multiple of its element size.
std::vector<size_t> safetensors_data_order(const std::vector<TensorHeader>& tensors);

// Writes `path` atomically: the header (tensors in the given order, then the metadata) at
// construction, each tensor's bytes by write() in safetensors_data_order, and the file appears
// under its name at commit(). Dropped before commit(), it leaves no file behind (and an older
// file of that name untouched). Names must be unique, non-empty and not "__metadata__".
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorHeader> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The tensor whose bytes come next (its header), or nullptr when all have been written.
  const TensorHeader* next() const;
  // The next tensor's values: a host or device array of its dtype and shape (checked, naming
  // the tensor and the file).
  void write(const Array& tensor);
  // Every tensor must have been written.
  void commit();

 private:
  std::string path_;
  std::vector<TensorHeader> tensors_;
  std::vector<size_t> order_;
  size_t written_ = 0;
  std::unique_ptr<AtomicFileWriter> file_;
};

}  // namespace mt::io
