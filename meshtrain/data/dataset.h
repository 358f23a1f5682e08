#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/data/example.h"

namespace mt::data {

// A random-access collection of examples. get() is called from the DataLoader's
// background thread, so implementations must allow concurrent const calls.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Throws mt::Error for an index outside [0, size()).
  virtual Example get(int64_t index) const = 0;
};

// Examples held in memory, e.g. the rows of read_tsv.
class VectorDataset final : public Dataset {
 public:
  explicit VectorDataset(std::vector<Example> examples) : examples_(std::move(examples)) {}
  int64_t size() const override { return int64_t(examples_.size()); }
  Example get(int64_t index) const override;
  const std::vector<Example>& examples() const { return examples_; }

 private:
  std::vector<Example> examples_;
};

std::shared_ptr<const Dataset> make_dataset(std::vector<Example> examples);

// Examples [begin, end) of another dataset, without copying (e.g. a held-out tail).
class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, int64_t begin, int64_t end);
  int64_t size() const override { return end_ - begin_; }
  Example get(int64_t index) const override;

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t begin_, end_;
};

// Throws "[op] index i out of range for a dataset of n examples" unless 0 <= i < n.
void check_index(int64_t index, int64_t size, const char* op);

}  // namespace mt::data
