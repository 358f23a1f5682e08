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
  for (const auto& [name, v] : values) {
    Sum& s = sums_[name];
    Array& into = v.sharded() ? s.laid_out : s.plain;
    const Array weighted = mul(v, weight);
    into = into.defined() ? mt::add(into, weighted) : weighted;
    s.weight += weight;
  }
}

MetricMeans MetricMeans::transformed(const std::function<Array(const Array&)>& f) const {
  MetricMeans out;
  for (const auto& [name, s] : sums_) {
    Sum& t = out.sums_[name];
    if (s.laid_out.defined()) t.laid_out = f(s.laid_out);
    if (s.plain.defined()) t.plain = f(s.plain);
    t.weight = s.weight;
  }
  return out;
}

std::map<std::string, double> MetricMeans::read(const std::string& prefix) const {
  std::map<std::string, double> out;
  for (const auto& [name, s] : sums_) {
    double total = 0;
    for (const Array* a : {&s.laid_out, &s.plain})
      if (a->defined()) total += dist::to_host(*a).item();
    out[prefix + name] = total / s.weight;
  }
  return out;
}

}  // namespace mt::train
