#pragma once
// PyTorch twins of the models in meshtrain/models, written with torch.nn.functional over a
// dict P of Hugging Face parameter names, and a check that runs a model and its twin on the
// same weights: logits and every parameter's gradient (through a random cotangent).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "meshtrain/meshtrain.h"
#include "tests/support/op_check.h"

namespace mt::testing {

// The twins themselves (tests/support/model_twins.py), read once.
inline const std::string& twin_library() {
  static const std::string text = [] {
    std::ifstream in(MT_MODEL_TWINS_SCRIPT);
    std::string t((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (t.empty()) throw std::runtime_error("cannot read the model twins " MT_MODEL_TWINS_SCRIPT);
    return t;
  }();
  return text;
}

// Random weights of unit-ish scale (HF's 0.02 init would make every logit nearly equal and
// every gradient tiny, which tests little); norm scales around 1.
inline Params random_model_params(const std::vector<models::ParamDef>& defs, uint64_t seed, double scale = 0.3) {
  Params p;
  for (size_t i = 0; i < defs.size(); ++i) {
    const models::ParamDef& d = defs[i];
    const bool norm = d.role.kind == models::ParamKind::norm;
    Array v = random_normal(d.shape, seed + i, DType::f32, norm ? 0.1 : scale);
    if (norm && d.init == models::InitKind::ones) v = add(v, 1.0);
    p.set(d.path, v);
  }
  return p;
}

// The oracle's inputs for a twin: the parameters, then `extras`; `names` is the Python line
// "names = ['path', ...]" the twin code starts with (xs[:len(names)] are the parameters).
struct TwinInputs {
  std::string names;
  std::vector<OracleTensor> tensors;
};
inline TwinInputs twin_inputs(const Params& params, const std::vector<Array>& extras) {
  TwinInputs t{"names = [", {}};
  for (const auto& [path, value] : params) {
    t.names += "'" + path + "', ";
    t.tensors.push_back(to_oracle(value));
  }
  t.names += "]\n";
  for (const Array& e : extras) t.tensors.push_back(to_oracle(e));
  return t;
}

struct TwinErrors {
  double logits = 0, grads = 0;
};

// Runs `model(params)` and the twin expression `twin_call` (which sees P, the dict of
// parameters, and X, the list of `extras`) on the same values; compares the logits, then
// every parameter's gradient of sum(logits * cotangent). Prints the max errors. Gradient
// errors may also reach grad_tol.scaled_atol times the parameter's largest |gradient| (f32
// round-off of sums that grow with the gradient: two correct f32 orders of the same sums,
// e.g. a GEMM's and a vector loop's in the fused attention, differ by a few 1e-6 of it in
// T5's layer-norm weights).
inline TwinErrors check_twin(const std::string& label, const Params& params, const std::vector<Array>& extras,
                             const std::function<Array(const Params&)>& model, const std::string& twin_call,
                             Tolerance logits_tol = {1e-5, 1e-5}, Tolerance grad_tol = {1e-5, 1e-4, 5e-6},
                             bool check_grads = true) {
  Array logits = model(params);
  Array cot = random_normal(logits.shape(), 4321);
  const TwinInputs in = twin_inputs(params, extras);
  const std::vector<OracleTensor>& inputs = in.tensors;
  std::string code = twin_library() + in.names + "P = dict(zip(names, xs[:len(names)]))\nX = xs[len(names):]\n" +
                     "out = " + twin_call + "\n";
  std::vector<OracleTensor> cots;
  if (check_grads) cots.push_back(to_oracle(cot));
  OracleResult ref = TorchOracle::instance().run(code, inputs, cots);
  TwinErrors err;
  err.logits = expect_close(logits, ref.outputs[0], logits_tol, label + " logits");
  if (check_grads) {
    auto [value, grads] = value_and_grad([&](const Params& p) { return sum(mul(model(p), cot)); })(params);
    size_t i = 0;
    std::string worst;
    for (const auto& [path, v] : params) {
      const auto& g = ref.grads[i++];
      if (!g) {
        ADD_FAILURE() << label << ": torch gives no gradient for " << path;
        continue;
      }
      double e = expect_close(grads[path], *g, grad_tol, label + " d/d" + path);
      double scale = 0;
      for (double x : g->data) scale = std::max(scale, std::abs(x));
      if (e > err.grads) err.grads = e, worst = path + ", max |grad| " + std::to_string(scale);
    }
    std::cout << "[twin] " << label << ": max |logits err| " << err.logits << ", max |grad err| " << err.grads
              << " (" << worst << ") over " << params.size() << " parameters\n";
  } else {
    std::cout << "[twin] " << label << ": max |logits err| " << err.logits << "\n";
  }
  return err;
}

}  // namespace mt::testing
