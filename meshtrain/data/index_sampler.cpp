#include "meshtrain/data/index_sampler.h"

#include <nlohmann/json.hpp>
#include <numeric>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace mt::data {

namespace {
// Separates the data order from other uses of the same seed (parameter init, dropout).
constexpr uint64_t kSamplerStream = 0x64617461'6f726472ull;  // "dataordr"
}  // namespace

void to_json(nlohmann::json& j, const SamplerState& s) {
  j = nlohmann::json{{"epoch", s.epoch}, {"batch", s.batch}};
  if (s.num_examples >= 0) j["num_examples"] = s.num_examples;
  if (s.batch_size >= 0) j["batch_size"] = s.batch_size;
  if (s.seed) j["seed"] = *s.seed;
  if (s.shuffle) j["shuffle"] = *s.shuffle;
}

void from_json(const nlohmann::json& j, SamplerState& s) {
  MT_CHECK(j.is_object() && j.contains("epoch") && j.contains("batch") && j["epoch"].is_number_integer() &&
               j["batch"].is_number_integer(),
           "[SamplerState] expected a JSON object with integer 'epoch' and 'batch', got ", j.dump());
  s = SamplerState{};
  s.epoch = j["epoch"].get<int64_t>();
  s.batch = j["batch"].get<int64_t>();
  if (j.contains("num_examples")) s.num_examples = j["num_examples"].get<int64_t>();
  if (j.contains("batch_size")) s.batch_size = j["batch_size"].get<int64_t>();
  if (j.contains("seed")) s.seed = j["seed"].get<uint64_t>();
  if (j.contains("shuffle")) s.shuffle = j["shuffle"].get<bool>();
}

int64_t SampledBatch::num_real() const {
  int64_t n = 0;
  for (bool pad : is_padding) n += pad ? 0 : 1;
  return n;
}

IndexSampler::IndexSampler(int64_t num_examples, SamplerOptions options)
    : num_examples_(num_examples), options_(options) {
  const auto& o = options_;
  MT_CHECK(num_examples_ > 0, "[IndexSampler] the dataset is empty");
  MT_CHECK(o.process_count >= 1 && o.process_index >= 0 && o.process_index < o.process_count,
           "[IndexSampler] process_index ", o.process_index, " out of range for process_count ", o.process_count);
  MT_CHECK(o.batch_size >= 1 && o.batch_size % o.process_count == 0, "[IndexSampler] the global batch size ",
           o.batch_size, " must be a positive multiple of process_count ", o.process_count);
  MT_CHECK(o.num_epochs >= 1 || o.num_epochs == kInfiniteEpochs, "[IndexSampler] num_epochs must be >= 1 or ",
           "kInfiniteEpochs, got ", o.num_epochs);
  batches_per_epoch_ = o.drop_remainder ? num_examples_ / o.batch_size : (num_examples_ + o.batch_size - 1) / o.batch_size;
  MT_CHECK(batches_per_epoch_ > 0, "[IndexSampler] ", num_examples_, " examples make no full batch of ", o.batch_size,
           " with drop_remainder");
}

std::vector<int64_t> IndexSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(num_examples_));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!options_.shuffle) return order;
  // Fisher-Yates with Philox block i supplying the draw for position i: a pure function
  // of (seed, epoch). 64-bit multiply-shift keeps the modulo bias below 2^-40.
  const RngKey key = RngKey{options_.seed, kSamplerStream}.fold_in(uint64_t(epoch));
  for (int64_t i = num_examples_ - 1; i > 0; --i) {
    const auto w = key.block(uint64_t(i));
    const uint64_t r = uint64_t(w[0]) << 32 | w[1];
    const auto j = int64_t((unsigned __int128)r * uint64_t(i + 1) >> 64);
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

SampledBatch IndexSampler::slice(const std::vector<int64_t>& order, int64_t epoch, int64_t batch) const {
  const int64_t local = local_batch_size();
  SampledBatch out;
  out.epoch = epoch;
  out.batch = batch;
  out.indices.resize(size_t(local));
  out.is_padding.resize(size_t(local));
  const int64_t first = batch * options_.batch_size + options_.process_index * local;
  for (int64_t k = 0; k < local; ++k) {
    const int64_t g = first + k;  // position in the epoch's order
    out.indices[size_t(k)] = order[size_t(g % num_examples_)];
    out.is_padding[size_t(k)] = g >= num_examples_;
  }
  return out;
}

SampledBatch IndexSampler::batch_at(int64_t epoch, int64_t batch) const {
  MT_CHECK(epoch >= 0 && (options_.num_epochs == kInfiniteEpochs || epoch < options_.num_epochs) && batch >= 0 &&
               batch < batches_per_epoch_,
           "[IndexSampler] batch (epoch ", epoch, ", batch ", batch, ") out of range: ", options_.num_epochs,
           " epochs of ", batches_per_epoch_, " batches");
  if (epoch == cached_epoch_) return slice(cached_order_, epoch, batch);
  return slice(epoch_order(epoch), epoch, batch);
}

bool IndexSampler::done() const { return options_.num_epochs != kInfiniteEpochs && epoch_ >= options_.num_epochs; }

std::optional<SampledBatch> IndexSampler::next() {
  if (done()) return std::nullopt;
  if (cached_epoch_ != epoch_) {
    cached_order_ = epoch_order(epoch_);
    cached_epoch_ = epoch_;
  }
  SampledBatch out = slice(cached_order_, epoch_, batch_);
  if (++batch_ == batches_per_epoch_) {
    batch_ = 0;
    ++epoch_;
  }
  return out;
}

int64_t IndexSampler::total_batches() const {
  return options_.num_epochs == kInfiniteEpochs ? kInfiniteEpochs : options_.num_epochs * batches_per_epoch_;
}

SamplerState IndexSampler::state() const {
  return SamplerState{epoch_, batch_, num_examples_, options_.batch_size, options_.seed, options_.shuffle};
}

void IndexSampler::restore(const SamplerState& s) {
  MT_CHECK(s.num_examples < 0 || s.num_examples == num_examples_, "[IndexSampler] the saved data position is for ",
           s.num_examples, " examples, this dataset has ", num_examples_);
  MT_CHECK(s.batch_size < 0 || s.batch_size == options_.batch_size, "[IndexSampler] the saved data position is for ",
           "global batch size ", s.batch_size, ", this sampler uses ", options_.batch_size);
  MT_CHECK(!s.seed || *s.seed == options_.seed, "[IndexSampler] the saved data position is for seed ", *s.seed,
           ", this sampler uses seed ", options_.seed);
  MT_CHECK(!s.shuffle || *s.shuffle == options_.shuffle, "[IndexSampler] the saved data position is for shuffle=",
           *s.shuffle ? "true" : "false", ", this sampler uses shuffle=", options_.shuffle ? "true" : "false");
  const bool end = options_.num_epochs != kInfiniteEpochs && s.epoch == options_.num_epochs && s.batch == 0;
  MT_CHECK(s.epoch >= 0 && s.batch >= 0 && s.batch < batches_per_epoch_ &&
               (options_.num_epochs == kInfiniteEpochs || s.epoch < options_.num_epochs || end),
           "[IndexSampler] saved position (epoch ", s.epoch, ", batch ", s.batch, ") is out of range for ",
           options_.num_epochs, " epochs of ", batches_per_epoch_, " batches");
  epoch_ = s.epoch;
  batch_ = s.batch;
}

}  // namespace mt::data
