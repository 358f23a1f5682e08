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

SubsetDataset::SubsetDataset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end)
    : base_(std::move(base)), begin_(begin), end_(end) {
  MT_CHECK(base_ != nullptr, "[SubsetDataset] no base dataset");
  MT_CHECK(0 <= begin && begin <= end && end <= base_->size(), "[SubsetDataset] range [", begin, ", ", end,
           ") does not fit a dataset of ", base_->size(), " examples");
}

Example SubsetDataset::get(int64_t index) const {
  check_index(index, size(), "SubsetDataset");
  return base_->get(begin_ + index);
}

std::shared_ptr<const Dataset> make_dataset(std::vector<Example> examples) {
  return std::make_shared<VectorDataset>(std::move(examples));
}

}  // namespace mt::data
