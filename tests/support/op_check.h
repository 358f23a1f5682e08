#pragma once
// Shared checks for op tests: compare an op's forward and VJP with a PyTorch snippet,
// and its VJP with central finite differences. Every check prints its max error.
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/meshtrain.h"
#include "tests/support/torch_oracle.h"

namespace mt::testing {

using OpFn = std::function<Array(const std::vector<Array>&)>;

OracleTensor to_oracle(const Array& a);
Array from_oracle(const OracleTensor& t);
std::string torch_dtype(DType d);

// Deterministic random inputs for tests.
Array random_normal(const Shape& shape, uint64_t seed, DType dtype = DType::f32, double scale = 1.0);
Array random_uniform(const Shape& shape, uint64_t seed, double lo, double hi, DType dtype = DType::f32);
Array random_ints(const Shape& shape, uint64_t seed, int64_t lo, int64_t hi, DType dtype = DType::i64);

struct Tolerance {
  double atol = 1e-5;
  double rtol = 1e-5;
  // Added to atol as a fraction of max |ref|: low-precision results round their partial
  // sums, so their error scales with the largest magnitudes, not with each element.
  double scaled_atol = 0;
};
Tolerance default_tolerance(DType dtype);

// max |a - b| / (atol + rtol * |b|) <= 1 ; prints the max abs error under `label`.
// Returns the max absolute error.
double expect_close(const Array& ours, const OracleTensor& ref, Tolerance tol, const std::string& label);
double expect_close(const Array& ours, const Array& ref, Tolerance tol, const std::string& label);

// Runs `fn` on inputs and `torch_code` (x0.. = inputs, sets `out`) on the same inputs with
// the same random cotangent; compares output and every floating input's gradient.
void check_against_torch(const std::string& label, const OpFn& fn, const std::string& torch_code,
                         const std::vector<Array>& inputs, Tolerance tol = {}, bool check_grads = true);

// max |a - b| over two arrays of the same size (host values; gather sharded arrays first).
double max_abs_diff(const Array& a, const Array& b);

// Runs fn and expects an mt::Error whose message contains every needle (prints it).
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles);

// The message of the mt::Error fn throws, or "no error".
std::string error_of(const std::function<void()>& fn);

// Directional central finite differences on f32 inputs vs our VJP.
void check_finite_differences(const std::string& label, const OpFn& fn, const std::vector<Array>& inputs,
                              double eps = 1e-3, double rel_tol = 2e-2);

}  // namespace mt::testing
