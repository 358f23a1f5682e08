#include "meshtrain/serve/serve_metrics.h"

#include "meshtrain/backend/matmul.h"
#include "meshtrain/train/memory_usage.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace mt::serve {

namespace {

// The shortest text that reads back as v (0.05, not 0.050000000000000003); whole numbers in
// plain digits (1400, not 1.4e+03), as counters are read.
std::string number(double v) {
  char buf[32];
  if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) {  // 2^53: every integer exact
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const char* type, const char* help, double value) {
  header(out, name, type, help);
  out += name + " " + number(value) + "\n";
}

// Label values escape backslash, quote and newline.
std::string label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1) {}

void Histogram::observe(double value) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

ServeMetrics::ServeMetrics()
    : latency_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
      first_token_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}) {}

void ServeMetrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{endpoint, status}];
}

void ServeMetrics::observe_latency(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  latency_.observe(seconds);
}

void ServeMetrics::observe_time_to_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  first_token_.observe(seconds);
}

std::string ServeMetrics::render(const EngineStats& e) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  header(out, "meshtrain_requests_total", "counter", "HTTP requests answered, by endpoint and status");
  for (const auto& [key, n] : requests_)
    out += "meshtrain_requests_total{endpoint=\"" + label(key.first) + "\",status=\"" + std::to_string(key.second) +
           "\"} " + std::to_string(n) + "\n";
  sample(out, "meshtrain_prompt_tokens_total", "counter", "prompt tokens prefilled", double(e.prompt_tokens));
  sample(out, "meshtrain_generation_tokens_total", "counter", "tokens generated", double(e.generated_tokens));
  sample(out, "meshtrain_cancelled_sequences_total", "counter", "sequences dropped early (client gone, stop string)",
         double(e.cancelled_sequences));
  sample(out, "meshtrain_decode_steps_total", "counter", "batched decode steps run", double(e.steps));
  sample(out, "meshtrain_queue_depth", "gauge", "requests waiting for admission", double(e.waiting_requests));
  sample(out, "meshtrain_running_sequences", "gauge", "sequences being decoded", double(e.running_sequences));
  sample(out, "meshtrain_kv_cache_used_bytes", "gauge", "KV-cache bytes held by running sequences", double(e.kv_used_bytes));
  sample(out, "meshtrain_kv_cache_reserved_bytes", "gauge", "KV-cache bytes reserved (prompt + max_tokens)",
         double(e.kv_reserved_bytes));
  sample(out, "meshtrain_kv_cache_budget_bytes", "gauge", "KV-cache byte budget (--kv-cache-mb)", double(e.kv_budget_bytes));
  sample(out, "meshtrain_kv_cache_usage_ratio", "gauge", "reserved / budget",
         e.kv_budget_bytes > 0 ? double(e.kv_reserved_bytes) / double(e.kv_budget_bytes) : 0.0);
  // Decode batch sizes: the engine counts each size; buckets are powers of two.
  header(out, "meshtrain_batch_size", "histogram", "sequences per decode step");
  int64_t cumulative = 0, total = 0;
  double sum = 0;
  size_t next = 0;
  for (int64_t le = 1;; le *= 2) {
    for (; next < e.batch_size_counts.size() && int64_t(next) <= le; ++next) {
      cumulative += e.batch_size_counts[next];
      sum += double(next) * double(e.batch_size_counts[next]);
    }
    out += "meshtrain_batch_size_bucket{le=\"" + std::to_string(le) + "\"} " + std::to_string(cumulative) + "\n";
    if (next >= e.batch_size_counts.size()) break;
  }
  total = cumulative;
  out += "meshtrain_batch_size_bucket{le=\"+Inf\"} " + std::to_string(total) + "\n";
  out += "meshtrain_batch_size_sum " + number(sum) + "\nmeshtrain_batch_size_count " + std::to_string(total) + "\n";
  // The process: a server meets new product shapes with every prompt length, so its memory and
  // its GEMM plans (bounded on each backend: MT_MATMUL_PLAN_CACHE) are worth watching.
  const double resident = train::resident_bytes();
  sample(out, "meshtrain_resident_bytes", "gauge", "resident memory of the server process", resident);
  sample(out, "meshtrain_peak_resident_bytes", "gauge", "largest resident memory so far",
         std::max(resident, train::peak_resident_bytes()));
  sample(out, "meshtrain_matmul_plans", "gauge", "GEMM plans cached, CPU and GPU (one per product shape)",
         double(cpu::matmul_cache_size() + cuda::matmul_cache_size()));
  sample(out, "meshtrain_matmul_plans_created_total", "counter",
         "GEMM plans created, CPU and GPU (rising steadily: the plan cache is smaller than the shapes met)",
         double(cpu::matmul_plans_created() + cuda::matmul_plans_created()));
  header(out, "meshtrain_request_latency_seconds", "histogram", "completion request latency, submission to last byte");
  latency_.render(out, "meshtrain_request_latency_seconds");
  header(out, "meshtrain_time_to_first_token_seconds", "histogram", "submission to first generated token");
  first_token_.render(out, "meshtrain_time_to_first_token_seconds");
  return out;
}

}  // namespace mt::serve
