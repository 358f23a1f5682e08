#pragma once
// Values a loss function reports beside its loss — DPO's rewards/margins, GRPO's clip
// fraction, a distillation's KL — logged with each step (and, prefixed "eval_", with each
// evaluation) under their names. The loss function calls record_metric with scalar arrays
// it has computed anyway; they are kept detached and read after the step, with the loss, so
// recording adds no host read inside the forward pass. A loss function called outside a
// recording scope (a user's own value_and_grad) records nothing.
#include <functional>
#include <map>
#include <string>

#include "meshtrain/core/array.h"

namespace mt::train {

// Records `value` (a scalar, any float dtype; a mesh-laid-out one too) under `name` in the
// innermost open MetricRecorder of this thread; a second value under the same name in one
// scope is added to the first (a loss function called on each half of a batch).
void record_metric(const std::string& name, const Array& value);

// A recording scope: opened around a loss call by the Trainer. Scopes nest per thread; the
// innermost one records.
class MetricRecorder {
 public:
  MetricRecorder();
  ~MetricRecorder();
  MetricRecorder(const MetricRecorder&) = delete;
  MetricRecorder& operator=(const MetricRecorder&) = delete;
  // What was recorded since the scope opened (or since the last take), as f32 scalars.
  std::map<std::string, Array> take();

 private:
  friend void record_metric(const std::string& name, const Array& value);
  std::map<std::string, Array> values_;
  MetricRecorder* outer_ = nullptr;
};

// Running means of recorded metrics over micro-batches or eval batches: weighted sums kept
// on the device as values are added, read on the host once at the end (at most two reads per
// metric — mesh-laid-out values and plain ones are summed apart — after the work is queued).
class MetricMeans {
 public:
  // Adds each of `values` with `weight` (rows of the batch, or 1 per micro-batch).
  void add(const std::map<std::string, Array>& values, double weight);
  // name -> weighted mean; the names prefixed by `prefix`.
  std::map<std::string, double> read(const std::string& prefix = "") const;
  bool empty() const { return sums_.empty(); }
  // The same sums with each array replaced by f(array) (a captured step copies them out).
  MetricMeans transformed(const std::function<Array(const Array&)>& f) const;

 private:
  struct Sum {
    Array laid_out, plain;  // Σ value·weight of each kind
    double weight = 0;
  };
  std::map<std::string, Sum> sums_;
};

}  // namespace mt::train
