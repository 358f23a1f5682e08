#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <vector>

namespace mt::data {

inline constexpr int64_t kInfiniteEpochs = -1;

struct SamplerOptions {
  uint64_t seed = 0;
  bool shuffle = true;
  // Drop the last partial global batch; otherwise fill it by repeating examples from the
  // start of the epoch's order and flag those slots as padding.
  bool drop_remainder = true;
  int64_t num_epochs = 1;  // or kInfiniteEpochs
  // The data-parallel position of this process: every process draws the same global
  // batches and keeps slice [process_index * b, (process_index + 1) * b) of each, where
  // b = batch_size / process_count.
  int process_index = 0;
  int process_count = 1;
  int64_t batch_size = 1;  // GLOBAL batch size, summed over processes
};

// The position of the next batch plus what it is valid for; restore() refuses a state
// taken from a sampler over a different dataset size, batch size, seed or shuffle
// (fields left at -1 / unset are not checked). Independent of process_count, so a
// checkpoint from 4 processes resumes on 1.
struct SamplerState {
  int64_t epoch = 0;
  int64_t batch = 0;  // batch index within the epoch
  int64_t num_examples = -1;
  int64_t batch_size = -1;
  std::optional<uint64_t> seed{};
  std::optional<bool> shuffle{};
  bool operator==(const SamplerState&) const = default;
};
void to_json(nlohmann::json& j, const SamplerState& state);
void from_json(const nlohmann::json& j, SamplerState& state);

// One process's part of a global batch.
struct SampledBatch {
  int64_t epoch = 0;
  int64_t batch = 0;
  std::vector<int64_t> indices;  // (batch_size / process_count,) example indices
  std::vector<bool> is_padding;  // same length: true for slots that only fill the last batch
  int64_t num_real() const;
};

// Batches of example indices, epoch after epoch. Each epoch's order is a permutation
// drawn from Philox keyed by (seed, epoch) alone, so any epoch or batch can be recomputed
// without replaying the ones before it (batch_at), and all processes agree on it.
class IndexSampler {
 public:
  IndexSampler(int64_t num_examples, SamplerOptions options);

  // The next batch of this process, or nullopt after the last epoch.
  std::optional<SampledBatch> next();
  bool done() const;
  SampledBatch batch_at(int64_t epoch, int64_t batch) const;
  // The global order of epoch `epoch` (identity without shuffle).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  SamplerState state() const;
  void restore(const SamplerState& state);

  int64_t num_examples() const { return num_examples_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t total_batches() const;  // kInfiniteEpochs when endless
  int64_t local_batch_size() const { return options_.batch_size / options_.process_count; }
  const SamplerOptions& options() const { return options_; }

 private:
  SampledBatch slice(const std::vector<int64_t>& order, int64_t epoch, int64_t batch) const;

  int64_t num_examples_;
  SamplerOptions options_;
  int64_t batches_per_epoch_;
  int64_t epoch_ = 0, batch_ = 0;
  // The current epoch's order, kept so next() does not redraw it for every batch.
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_order_;
};

}  // namespace mt::data
