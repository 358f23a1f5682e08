#include "meshtrain/train/step_metrics.h"

#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/ops/elementwise.h"

namespace mt::train {

namespace {
thread_local MetricRecorder* innermost = nullptr;
}

void record_metric(const std::string& name, const Array& value) {
  if (innermost == nullptr) return;
  MT_CHECK(value.numel() == 1, "[metrics] record_metric('", name, "'): a metric is a scalar, got shape ",
           value.shape().str());
  Array v = cast(value.detach(), DType::f32);
  auto [it, fresh] = innermost->values_.emplace(name, v);
  if (!fresh) it->second = add(it->second, v);
}

MetricRecorder::MetricRecorder() : outer_(innermost) { innermost = this; }

MetricRecorder::~MetricRecorder() { innermost = outer_; }

std::map<std::string, Array> MetricRecorder::take() { return std::exchange(values_, {}); }

void MetricMeans::add(const std::map<std::string, Array>& values, double weight) {
  for (const auto& [name, v] : values) parts_.push_back({name, v, weight});
}

std::map<std::string, double> MetricMeans::read(const std::string& prefix) const {
  std::map<std::string, std::pair<double, double>> sums;  // name -> (weighted sum, weight)
  for (const Part& p : parts_) {
    auto& [s, w] = sums[p.name];
    s += dist::to_host(p.value).item() * p.weight;
    w += p.weight;
  }
  std::map<std::string, double> out;
  for (const auto& [name, sw] : sums) out[prefix + name] = sw.first / sw.second;
  return out;
}

}  // namespace mt::train
