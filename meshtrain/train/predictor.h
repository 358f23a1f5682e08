#pragma once
// The Predictor (DESIGN.md §7): batched inference with the user's collate, predict and
// output functions on any mesh. The last global batch is padded to full size and the
// padding's outputs dropped; outputs come back in example order on every rank.
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/train/trainer.h"

namespace mt::train {

// (params, global batch) -> named outputs whose first dimension indexes examples.
using PredFn = std::function<Batch(const Params&, const Batch&)>;

template <class Out>
class Predictor {
 public:
  // Host outputs of one global batch -> one Out per example (padding included).
  using OutputFn = std::function<std::vector<Out>(const Batch& host_outputs)>;

  Predictor(Deployer& deployer, CollateFn collate, PredFn pred_fn, OutputFn output_fn)
      : deployer_(deployer), collate_(std::move(collate)), pred_(std::move(pred_fn)), output_(std::move(output_fn)) {
    MT_CHECK(collate_ && pred_ && output_, "[predictor] collate, predict and output functions are required");
  }

  std::vector<Out> predict(const Params& params, std::shared_ptr<const data::Dataset> dataset,
                           int64_t per_device_batch_size) {
    MT_CHECK(dataset != nullptr && per_device_batch_size > 0, "[predictor] needs a dataset and a positive batch size");
    data::SamplerOptions so;
    so.shuffle = false;
    so.drop_remainder = false;  // the last batch is padded; its padding is dropped below
    so.batch_size = per_device_batch_size * deployer_.data_size();
    so.process_index = deployer_.data_index();
    so.process_count = deployer_.data_size();
    const int64_t n = dataset->size();
    std::vector<Out> out;
    if (n == 0) return out;
    out.reserve(size_t(n));
    data::DataLoader<Batch> loader(dataset, data::IndexSampler(n, so), collate_, 1);
    autodiff::NoGradGuard no_grad;
    // Mixed precision: the parameters cast once; floating outputs come back as f32.
    const Params compute = precision_policy().cast_for_compute(params);
    while (auto b = loader.next()) {
      Batch outputs = pred_(compute, deployer_.shard_batch(b->data));
      Batch host;
      for (const auto& [name, a] : outputs)
        host.set(name, dist::to_host(is_floating(a.dtype()) ? cast(a, DType::f32) : a));
      std::vector<Out> items = output_(host);
      MT_CHECK(int64_t(items.size()) == so.batch_size, "[predictor] output_fn returned ", items.size(),
               " outputs for a batch of ", so.batch_size);
      // Without shuffling, global batch k holds examples k·B ... in order, padding last.
      const int64_t real = std::min<int64_t>(so.batch_size, n - int64_t(out.size()));
      out.insert(out.end(), items.begin(), items.begin() + real);
    }
    return out;
  }

 private:
  Deployer& deployer_;
  CollateFn collate_;
  PredFn pred_;
  OutputFn output_;
};

}  // namespace mt::train
