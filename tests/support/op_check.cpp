#include "tests/support/op_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

namespace mt::testing {

std::string torch_dtype(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::boolean: return "bool";
  }
  return "float32";
}

OracleTensor to_oracle(const Array& a) {
  return OracleTensor{a.shape().dims(), torch_dtype(a.dtype()), a.to_doubles()};
}

Array from_oracle(const OracleTensor& t) {
  DType d = DType::f32;
  if (t.dtype == "bfloat16") d = DType::bf16;
  else if (t.dtype == "float16") d = DType::f16;
  else if (t.dtype == "int32") d = DType::i32;
  else if (t.dtype == "int64") d = DType::i64;
  else if (t.dtype == "bool") d = DType::boolean;
  return Array::from_vector(t.data, Shape(t.shape), d);
}

Array random_normal(const Shape& shape, uint64_t seed, DType dtype, double scale) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(size_t(shape.numel()));
  for (double& x : v) x = dist(gen);
  return Array::from_vector(v, shape, dtype);
}

Array random_uniform(const Shape& shape, uint64_t seed, double lo, double hi, DType dtype) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(size_t(shape.numel()));
  for (double& x : v) x = dist(gen);
  return Array::from_vector(v, shape, dtype);
}

Array random_ints(const Shape& shape, uint64_t seed, int64_t lo, int64_t hi, DType dtype) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<int64_t> v(size_t(shape.numel()));
  for (int64_t& x : v) x = dist(gen);
  return Array::from_vector(v, shape, dtype);
}

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16: return {2e-2, 2e-2, 1e-2};
    case DType::f16: return {2e-3, 2e-3, 2e-3};
    default: return {1e-5, 1e-5};
  }
}

namespace {
double compare(const std::vector<double>& a, const std::vector<double>& b, Tolerance tol, double* worst_ratio) {
  double max_err = 0, ratio = 0, max_ref = 0;
  for (double v : b)
    if (std::isfinite(v)) max_ref = std::max(max_ref, std::abs(v));
  tol.atol += tol.scaled_atol * max_ref;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::isinf(a[i]) && a[i] == b[i]) continue;
    double err = std::abs(a[i] - b[i]);
    if (std::isnan(err)) err = INFINITY;
    max_err = std::max(max_err, err);
    ratio = std::max(ratio, err / (tol.atol + tol.rtol * std::abs(b[i])));
  }
  *worst_ratio = ratio;
  return max_err;
}
}  // namespace

double expect_close(const Array& ours, const OracleTensor& ref, Tolerance tol, const std::string& label) {
  EXPECT_EQ(ours.shape().dims(), ref.shape) << label << ": shape " << ours.shape().str();
  if (ours.shape().dims() != ref.shape) return INFINITY;
  double ratio = 0;
  double err = compare(ours.to_doubles(), ref.data, tol, &ratio);
  std::cout << "  [max err] " << label << ": " << err << "\n";
  EXPECT_LE(ratio, 1.0) << label << ": max abs error " << err << " exceeds atol " << tol.atol << " rtol "
                        << tol.rtol;
  return err;
}

double expect_close(const Array& ours, const Array& ref, Tolerance tol, const std::string& label) {
  return expect_close(ours, to_oracle(ref), tol, label);
}

void check_against_torch(const std::string& label, const OpFn& fn, const std::string& torch_code,
                         const std::vector<Array>& inputs, Tolerance tol, bool check_grads) {
  std::vector<OracleTensor> ins;
  for (const Array& a : inputs) ins.push_back(to_oracle(a));
  Array out;
  std::vector<Array> grads;
  Array cot;
  bool want_grads = check_grads;
  if (want_grads) {
    Array probe = fn(inputs);
    want_grads = is_floating(probe.dtype());
    if (want_grads) {
      cot = random_normal(probe.shape(), 977, probe.dtype());
      auto [o, g] = vjp(fn, inputs, cot);
      out = o;
      grads = g;
    } else {
      out = probe;
    }
  } else {
    out = fn(inputs);
  }
  std::vector<OracleTensor> cots;
  if (want_grads) cots.push_back(to_oracle(cot));
  OracleResult ref = TorchOracle::instance().run(torch_code, ins, cots);
  ASSERT_EQ(ref.outputs.size(), 1u) << label;
  expect_close(out, ref.outputs[0], tol, label + " forward");
  if (!want_grads) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) continue;
    std::string gl = label + " grad x" + std::to_string(i);
    if (!ref.grads[i]) {
      // torch saw no dependence: ours must be zero.
      Array zeros = Array::zeros(inputs[i].shape(), inputs[i].dtype());
      expect_close(grads[i], zeros, tol, gl);
    } else {
      expect_close(grads[i], *ref.grads[i], tol, gl);
    }
  }
}

double max_abs_diff(const Array& a, const Array& b) {
  auto x = a.to_doubles(), y = b.to_doubles();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected mt::Error containing '" << (needles.empty() ? "" : needles[0]) << "'";
  } catch (const Error& e) {
    std::string m = e.what();
    std::cout << "  [error] " << m << "\n";
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "missing '" << n << "' in: " << m;
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void check_finite_differences(const std::string& label, const OpFn& fn, const std::vector<Array>& inputs,
                              double eps, double rel_tol) {
  Array probe = fn(inputs);
  Array cot = random_normal(probe.shape(), 4242, DType::f32);
  auto [out, grads] = vjp(fn, inputs, cot);
  // Directional derivative along a random direction v: <grad, v> vs (L(x+εv) - L(x-εv)) / 2ε.
  std::vector<Array> dirs;
  double analytic = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != DType::f32) {
      dirs.emplace_back();
      continue;
    }
    Array v = random_normal(inputs[i].shape(), 1000 + i, DType::f32);
    dirs.push_back(v);
    auto g = grads[i].to_doubles(), vv = v.to_doubles();
    for (size_t k = 0; k < g.size(); ++k) analytic += g[k] * vv[k];
  }
  auto loss_at = [&](double sign) {
    std::vector<Array> shifted;
    for (size_t i = 0; i < inputs.size(); ++i)
      shifted.push_back(dirs[i].defined() ? add(inputs[i], mul(dirs[i], sign * eps)) : inputs[i]);
    auto o = fn(shifted).to_doubles();
    auto c = cot.to_doubles();
    double s = 0;
    for (size_t k = 0; k < o.size(); ++k) s += o[k] * c[k];
    return s;
  };
  double numeric = (loss_at(1) - loss_at(-1)) / (2 * eps);
  double err = std::abs(numeric - analytic);
  double scale = std::max({1.0, std::abs(numeric), std::abs(analytic)});
  std::cout << "  [fd] " << label << ": analytic " << analytic << " numeric " << numeric << " rel err "
            << err / scale << "\n";
  EXPECT_LE(err / scale, rel_tol) << label << ": finite differences disagree";
}

}  // namespace mt::testing
