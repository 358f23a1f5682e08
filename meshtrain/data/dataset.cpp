#include "meshtrain/data/dataset.h"

#include "meshtrain/core/error.h"

namespace mt::data {

void check_index(int64_t index, int64_t size, const char* op) {
  MT_CHECK(index >= 0 && index < size, "[", op, "] index ", index, " out of range for a dataset of ", size,
           " examples");
}

Example VectorDataset::get(int64_t index) const {
  check_index(index, size(), "VectorDataset");
  return examples_[size_t(index)];
}

std::shared_ptr<const Dataset> make_dataset(std::vector<Example> examples) {
  return std::make_shared<VectorDataset>(std::move(examples));
}

}  // namespace mt::data
