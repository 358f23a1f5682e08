#pragma once
// LoRA's hyper-parameters, carried by every model config so that a forward pass knows the
// scale and dropout of the adapters its Params hold (rank 0: no adapters).
#include <cmath>
#include <cstdint>
#include <string>

namespace mt::models {

struct LoraOptions {
  int64_t rank = 0;      // r; 0 = no adapters
  double alpha = 8.0;    // lora_alpha (PEFT's default)
  double dropout = 0.0;  // on the adapter's input only, when training
  bool use_rslora = false;
  // Which dense layers get adapters: a std::regex searched in each module path (the
  // parameter path without ".weight"); empty = the model family's default targets.
  std::string targets;

  bool enabled() const { return rank > 0; }
  // alpha / r, or alpha / sqrt(r) with rank-stabilized LoRA.
  double scale() const {
    return use_rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
  }
};

}  // namespace mt::models
