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
          // 16-bit products are defined as f32-accumulated and rounded once, so the reference
          // widens to f32 and rounds back: torch 1.13 has no f16 GEMM on the CPU, and its bf16
          // GEMM without oneDNN's bf16 kernels (AVX2-only CPUs) accumulates in bf16, 1.5 off at K 198.
          const bool narrow = dt != DType::f32;
          std::string wide = narrow ? ".float()" : "";
          std::string back = dt == DType::f16 ? ".half()" : dt == DType::bf16 ? ".bfloat16()" : "";
          std::string code = "out = torch.matmul(" + torch_operand("x0", ta) + wide + ", " + torch_operand("x1", tb) +
                             wide + ")" + back;
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

// Under MatmulPrecision::bf16 an f32 matmul is the f32-accumulated product of the
// bf16-rounded operands, and so are its gradient matmuls (the cotangent rounded too).
TEST(MatmulOracle, Bf16PrecisionRoundsOperandsAndAccumulatesInF32) {
  struct Case {
    Shape a, b;  // stored layouts
    bool ta, tb;
  };
  const std::vector<Case> cases = {{{33, 17}, {17, 65}, false, false},
                                   {{2, 7, 40}, {2, 40, 9}, false, false},
                                   {{2, 3, 64, 48}, {96, 48}, false, true},  // activations @ weightᵀ fast path
                                   {{3, 40, 7}, {9, 40}, true, true},
                                   {{2, 1, 12, 20}, {3, 20, 6}, false, false}};  // broadcast batch
  const std::string code = R"(
r = lambda t: t.bfloat16().float()
ra, rb = r(x0).requires_grad_(), r(x1).requires_grad_()
o = torch.matmul(ra.transpose(-1, -2) if ta else ra, rb.transpose(-1, -2) if tb else rb)
ga, gb = torch.autograd.grad(o, (ra, rb), r(x2))
out = (o.detach(), ga, gb)
)";
  for (const Case& c : cases) {
    const std::string label = "bf16-precision matmul " + c.a.str() + (c.ta ? "^T" : "") + " @ " + c.b.str() + (c.tb ? "^T" : "");
    Array a = random_normal(c.a, 11), b = random_normal(c.b, 12);
    Array out_f32 = matmul(a, b, c.ta, c.tb);
    Array g = random_normal(out_f32.shape(), 13);
    Array out;
    Params grads;
    {
      MatmulPrecisionScope bf16(MatmulPrecision::bf16);
      EXPECT_EQ(matmul_precision(), MatmulPrecision::bf16);
      auto loss = [&](const Params& p) {
        out = matmul(p.at("a"), p.at("b"), c.ta, c.tb);
        return sum(mul(out, g));  // d loss / d out = g exactly
      };
      grads = value_and_grad(loss)(Params{{"a", a}, {"b", b}}).second;
    }
    EXPECT_EQ(matmul_precision(), MatmulPrecision::f32);  // the scope restored it
    EXPECT_EQ(out.dtype(), DType::f32);
    const std::string flags = std::string("ta = ") + (c.ta ? "True" : "False") + "\ntb = " + (c.tb ? "True" : "False") + "\n";
    OracleResult ref = TorchOracle::instance().run(flags + code, {to_oracle(a), to_oracle(b), to_oracle(g)});
    const Tolerance tol{2e-5, 2e-5};
    expect_close(out, ref.outputs[0], tol, label + " out");
    expect_close(grads.at("a"), ref.outputs[1], tol, label + " d/da");
    expect_close(grads.at("b"), ref.outputs[2], tol, label + " d/db");
    // The rounding is real: the f32 product differs by far more than the tolerance.
    double diff = 0;
    auto x = out.to_doubles(), y = out_f32.to_doubles();
    for (size_t i = 0; i < x.size(); ++i) diff = std::max(diff, std::abs(x[i] - y[i]));
    std::cout << "  " << label << ": bf16 vs f32 products differ by up to " << diff << "\n";
    EXPECT_GT(diff, 1e-3) << label;
  }
  expect_error([] { matmul_precision_from_name("fp8", "--precision"); }, {"--precision", "fp8", "tf32", "bf16"});
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
