// matmul forward and VJP against torch.matmul: every transpose combination, batch
// broadcasting, the activations-times-weight fast path, odd sizes, f32/bf16/f16.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

std::string torch_operand(const char* name, bool transposed) {
  return transposed ? std::string(name) + ".transpose(-1, -2)" : std::string(name);
}

TEST(MatmulOracle, TransposesBatchesAndDtypes) {
  struct Case {
    Shape a, b;  // logical (..., M, K) and (..., K, N)
  };
  const std::vector<Case> cases = {
      {{7, 5}, {5, 3}},          {{1, 1}, {1, 1}},          {{2, 7, 5}, {2, 5, 9}},
      {{3, 1, 4, 6}, {2, 6, 5}}, {{2, 3, 33, 17}, {17, 65}}, {{4, 8}, {3, 8, 2}},
  };
  for (const Case& c : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
          // Store the operands in the layout the flags say, so transposes are real.
          std::vector<int64_t> sa = c.a.dims(), sb = c.b.dims();
          if (ta) std::swap(sa[sa.size() - 1], sa[sa.size() - 2]);
          if (tb) std::swap(sb[sb.size() - 1], sb[sb.size() - 2]);
          Array a = random_normal(Shape(sa), 100 + ta, dt);
          Array b = random_normal(Shape(sb), 200 + tb, dt);
          // torch 1.13 has no f16 GEMM on CPU: its reference widens to f32 and rounds back.
          std::string wide = dt == DType::f16 ? ".float()" : "";
          std::string code = "out = torch.matmul(" + torch_operand("x0", ta) + wide + ", " + torch_operand("x1", tb) +
                             wide + ")" + (dt == DType::f16 ? ".half()" : "");
          Tolerance tol = dt == DType::f32 ? Tolerance{2e-5, 1e-5} : default_tolerance(dt);
          check_against_torch("matmul " + c.a.str() + "@" + c.b.str() + " ta=" + std::to_string(ta) +
                                  " tb=" + std::to_string(tb) + " " + dtype_name(dt),
                              [ta, tb](const std::vector<Array>& in) { return matmul(in[0], in[1], ta, tb); }, code,
                              {a, b}, tol);
        }
      }
    }
  }
}

TEST(MatmulOracle, FiniteDifferences) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Array a = random_normal(ta ? Shape{2, 4, 3} : Shape{2, 3, 4}, 1);
      Array b = random_normal(tb ? Shape{5, 4} : Shape{4, 5}, 2);
      check_finite_differences("matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb),
                               [ta, tb](const std::vector<Array>& in) { return matmul(in[0], in[1], ta, tb); },
                               {a, b});
    }
}

TEST(MatmulErrors, NameShapes) {
  try {
    matmul(Array::zeros({2, 3}), Array::zeros({4, 5}));
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[matmul]"), std::string::npos) << m;
    EXPECT_NE(m.find("(2, 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("(4, 5)"), std::string::npos) << m;
  }
  EXPECT_THROW(matmul(Array::zeros({3}), Array::zeros({3, 3})), Error);
  EXPECT_THROW(matmul(Array::zeros({2, 3}), Array::zeros({3, 3}, DType::bf16)), Error);
  EXPECT_THROW(matmul(Array::zeros({2, 2, 3}), Array::zeros({3, 3, 4})), Error);  // batch 2 vs 3
  EXPECT_THROW(matmul(Array::zeros({2, 3}, DType::i64), Array::zeros({3, 3}, DType::i64)), Error);
}

}  // namespace
}  // namespace mt::testing
