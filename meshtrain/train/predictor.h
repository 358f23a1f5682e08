#pragma once
// The Predictor (DESIGN.md §7): batched inference with the user's collate, predict and
// output functions on any mesh. The last global batch is padded to full size and the
// padding's outputs dropped; outputs come back in example order on every rank. On one GPU
// process the predict step is captured as a CUDA graph per batch shape and replayed
// (train/captured_forward.h); a step that reads to the host (generation's loops) stays eager.
// Outputs are read a few batches behind the device, not after each batch.
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/autodiff/node.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/data_loader.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/deferred_checks.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/train/captured_forward.h"
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

  // Whether predict steps are captured as CUDA graphs: automatic captures those that can be
  // and runs the others eagerly, silently; on stops with the reason one cannot.
  // (predict() captures anew when the mode it derives from this changes.)
  void set_cuda_graphs(CudaGraphs mode) { graphs_ = mode; }
  // Batch fields the collate pads only to its own slice's longest row (batch_shapes.h): with
  // several data ranks they are padded to the ranks' longest before each batch.
  void set_padded_fields(std::vector<PaddedFields> groups) { padded_fields_ = std::move(groups); }
  // Batches replayed from a captured graph so far.
  int64_t captured_replays() const { return captured_ ? captured_->replays() : 0; }

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
    // Index checks (token ids) keep their verdicts on the device until the batch's outputs are
    // read: a verdict read mid-step would make the step uncapturable.
    auto forward = [&](const Batch& batch) {
      ForwardResults r;
      DeferredChecks checks;
      for (const auto& [name, a] : pred_(compute, batch))
        r.outputs.set(name, is_floating(a.dtype()) ? cast(a, DType::f32) : a);
      r.checks = checks.take();
      return r;
    };
    // Decided per call (the parameters may be elsewhere than last time); the same decision
    // keeps the graphs captured so far.
    const CudaGraphs mode = graphs_mode_for(graphs_, compute);
    const std::string why_not = why_forward_cannot_be_captured(deployer_.mesh().comm().size(), compute);
    if (!captured_ || mode != captured_mode_ || why_not != captured_why_not_) {
      captured_ = std::make_unique<CapturedForward>(mode, "the predict step", nullptr);
      captured_->refuse_all(why_not);
      captured_mode_ = mode, captured_why_not_ = why_not;
    }
    // Outputs are read kInFlight batches behind the device: reading each batch's at once would
    // make the host wait for the device every batch, and the device then idles while the host
    // prepares the next one. (Bounded, as every batch's outputs are held until read.)
    std::deque<ForwardResults> in_flight;
    auto read_oldest = [&] {
      ForwardResults r = std::move(in_flight.front());
      in_flight.pop_front();
      read_checks(std::move(r.checks));
      Batch host;
      for (const auto& [name, a] : r.outputs) host.set(name, dist::to_host(a));
      std::vector<Out> items = output_(host);
      MT_CHECK(int64_t(items.size()) == so.batch_size, "[predictor] output_fn returned ", items.size(),
               " outputs for a batch of ", so.batch_size);
      // Without shuffling, global batch k holds examples k·B ... in order, padding last.
      const int64_t real = std::min<int64_t>(so.batch_size, n - int64_t(out.size()));
      out.insert(out.end(), items.begin(), items.begin() + real);
    };
    while (auto b = loader.next()) {
      const Batch local = deployer_.data_size() > 1 && !padded_fields_.empty()
                              ? pad_to_ranks_longest(b->data, padded_fields_, deployer_.mesh().comm())
                              : b->data;
      in_flight.push_back(captured_->run(deployer_.shard_batch(local), compute, forward));
      if (in_flight.size() >= kInFlight) read_oldest();
    }
    while (!in_flight.empty()) read_oldest();
    return out;
  }

 private:
  static constexpr size_t kInFlight = 4;

  Deployer& deployer_;
  CollateFn collate_;
  PredFn pred_;
  OutputFn output_;
  CudaGraphs graphs_ = CudaGraphs::automatic;
  std::vector<PaddedFields> padded_fields_;
  std::unique_ptr<CapturedForward> captured_;  // made at the first prediction
  CudaGraphs captured_mode_ = CudaGraphs::off;
  std::string captured_why_not_;
};

}  // namespace mt::train
