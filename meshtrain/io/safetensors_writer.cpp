#include "meshtrain/io/safetensors_writer.h"

#include <algorithm>
#include <numeric>
#include <nlohmann/json.hpp>
#include <set>

#include "meshtrain/core/error.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/io/safetensors.h"

namespace mt::io {

namespace {
// The byte buffer starts at a multiple of 8 (the header is space-padded, as the format
// allows): with larger elements first, every tensor is then aligned to its element size.
constexpr size_t kAlign = 8;
}  // namespace

std::vector<size_t> safetensors_data_order(const std::vector<TensorHeader>& tensors) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype); });
  return order;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorHeader> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)), order_(safetensors_data_order(tensors_)) {
  std::set<std::string> names;
  for (const TensorHeader& t : tensors_) {
    MT_CHECK(!t.name.empty(), "[safetensors] ", path, ": empty tensor name");
    MT_CHECK(t.name != "__metadata__", "[safetensors] ", path, ": '__metadata__' is reserved and cannot name a tensor");
    MT_CHECK(names.insert(t.name).second, "[safetensors] ", path, ": tensor '", t.name, "' is named twice");
  }
  std::vector<std::pair<size_t, size_t>> offsets(tensors_.size());
  size_t pos = 0;
  for (size_t i : order_) {
    const size_t bytes = size_t(tensors_[i].shape.numel()) * dtype_size(tensors_[i].dtype);
    offsets[i] = {pos, pos + bytes};
    pos += bytes;
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = safetensors_dtype_name(tensors_[i].dtype);
    t["shape"] = tensors_[i].shape.dims();
    t["data_offsets"] = {offsets[i].first, offsets[i].second};
    header[tensors_[i].name] = std::move(t);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {
    throw Error(detail::concat("[safetensors] ", path, ": cannot encode the header (names and metadata must be UTF-8): ",
                               ex.what()));
  }
  while ((8 + text.size()) % kAlign != 0) text.push_back(' ');
  file_ = std::make_unique<AtomicFileWriter>(path, "safetensors");
  const uint64_t n = text.size();
  file_->write(&n, 8);
  file_->write(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

const TensorHeader* SafetensorsWriter::next() const {
  return written_ < order_.size() ? &tensors_[order_[written_]] : nullptr;
}

void SafetensorsWriter::write(const Array& tensor) {
  const TensorHeader* t = next();
  MT_CHECK(t != nullptr, "[safetensors] ", path_, ": every tensor is written already");
  MT_CHECK(tensor.defined(), "[safetensors] ", path_, ": tensor '", t->name, "' is undefined");
  MT_CHECK(!tensor.sharded(), "[safetensors] ", path_, ": tensor '", t->name, "' ", tensor.str(),
           " is sharded: gather it with dist::to_host first (or save per-rank shards)");
  MT_CHECK(tensor.dtype() == t->dtype && tensor.shape() == t->shape, "[safetensors] ", path_, ": tensor '", t->name,
           "' is ", tensor.str(), " but its header says ", dtype_name(t->dtype), t->shape.str());
  const Array host = tensor.to(Device::cpu());  // a device array is copied out first
  file_->write(host.raw(), host.nbytes());
  ++written_;
}

void SafetensorsWriter::commit() {
  MT_CHECK(next() == nullptr, "[safetensors] ", path_, ": tensor '", next() ? next()->name : "", "' was never written");
  file_->commit();
}

}  // namespace mt::io
