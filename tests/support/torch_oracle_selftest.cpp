// Checks the oracle plumbing itself (not meshtrain ops) against known values.
#include "torch_oracle.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace mt::testing {
namespace {

OracleResult run(const std::string& code, const std::vector<OracleTensor>& inputs,
                 const std::vector<OracleTensor>& cotangents = {}) {
  return TorchOracle::instance().run(code, inputs, cotangents);
}

TEST(TorchOracle, MatmulOfKnownMatrices) {
  OracleTensor a{{2, 3}, "float32", {1, 2, 3, 4, 5, 6}};
  OracleTensor b{{3, 2}, "float32", {7, 8, 9, 10, 11, 12}};
  auto r = run("out = x0 @ x1", {a, b});
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_TRUE(r.grads.empty());
  EXPECT_EQ(r.outputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(r.outputs[0].dtype, "float32");
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{58, 64, 139, 154}));
}

TEST(TorchOracle, GradientWithCotangent) {
  OracleTensor x{{3}, "float32", {1, -2, 3}};
  OracleTensor y{{3}, "float32", {4, 5, 6}};
  // Scalar output with cotangent 2: d/dx0 = 2 * 2 * x0; x1 is unused.
  auto r = run("out = (x0 * x0).sum()", {x, y}, {OracleTensor{{}, "float32", {2}}});
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_TRUE(r.outputs[0].shape.empty());
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{14}));
  ASSERT_EQ(r.grads.size(), 2u);
  ASSERT_TRUE(r.grads[0].has_value());
  EXPECT_EQ(r.grads[0]->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(r.grads[0]->data, (std::vector<double>{4, -8, 12}));
  EXPECT_FALSE(r.grads[1].has_value());
}

TEST(TorchOracle, Bfloat16RoundTrip) {
  // 1 + 2^-9 is not representable in bf16 (7 mantissa bits) and rounds to 1.
  OracleTensor x{{3}, "bfloat16", {1.0 + 1.0 / 512, 3.140625, -0.5}};
  auto r = run("out = x0", {x});
  EXPECT_EQ(r.outputs[0].dtype, "bfloat16");
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{1.0, 3.140625, -0.5}));
}

TEST(TorchOracle, Int64Input) {
  OracleTensor x{{2, 2}, "int64", {1, 2, 3, 4'000'000'000}};
  auto r = run("assert x0.dtype == torch.int64\nout = x0 * 2", {x});
  EXPECT_EQ(r.outputs[0].dtype, "int64");
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{2, 4, 6, 8'000'000'000}));
}

TEST(TorchOracle, TupleOutputWithMixedDtypes) {
  OracleTensor x{{2, 3}, "float32", {3, 1, 2, -1, 5, 4}};
  auto r = run("out = x0.max(dim=1)", {x}, {OracleTensor{{2}, "float32", {1, 10}}, OracleTensor{{2}, "int64", {0, 0}}});
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{3, 5}));
  EXPECT_EQ(r.outputs[1].dtype, "int64");
  EXPECT_EQ(r.outputs[1].data, (std::vector<double>{0, 1}));
  ASSERT_EQ(r.grads.size(), 1u);
  ASSERT_TRUE(r.grads[0].has_value());
  EXPECT_EQ(r.grads[0]->data, (std::vector<double>{1, 0, 0, 0, 10, 0}));
}

TEST(TorchOracle, PythonErrorSurfacesAndWorkerSurvives) {
  try {
    run("print('stray stdout must not break the protocol')\nout = x0 @ x0", {OracleTensor{{2, 3}, "float32", {1, 2, 3, 4, 5, 6}}});
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("Traceback"), std::string::npos) << msg;
    EXPECT_NE(msg.find("RuntimeError"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shapes cannot be multiplied"), std::string::npos) << msg;
  }
  EXPECT_THROW(run("y = 1", {}), std::runtime_error);  // never assigned `out`
  // The same worker keeps serving afterwards.
  auto r = run("out = torch.arange(3)", {});
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{0, 1, 2}));
}

TEST(TorchOracle, RejectsMismatchedDataBeforeSending) {
  EXPECT_THROW(run("out = x0", {OracleTensor{{2, 2}, "float32", {1, 2, 3}}}), std::invalid_argument);
  auto r = run("out = x0 + 1", {OracleTensor{{1}, "float32", {1}}});
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{2}));
}

TEST(TorchOracle, RecoversAfterWorkerDeath) {
  try {
    run("import os\nos._exit(7)", {});
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exit status 7"), std::string::npos) << e.what();
  }
  auto r = run("out = torch.ones(2, dtype=torch.bool)", {});  // a fresh worker starts
  EXPECT_EQ(r.outputs[0].dtype, "bool");
  EXPECT_EQ(r.outputs[0].data, (std::vector<double>{1, 1}));
}

}  // namespace
}  // namespace mt::testing
