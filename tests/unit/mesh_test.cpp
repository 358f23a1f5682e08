// Mesh on a single process (no mpirun): spec parsing, axis queries, size-1 communicators and
// the error messages for malformed specs, unknown axes and sizes that do not fit the world.
#include <gtest/gtest.h>

#include "tests/support/op_check.h"

#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/mesh.h"

namespace mt::dist {
namespace {

using mt::testing::error_of;

TEST(Mesh, ParsesSpecsOnOneDevice) {
  ASSERT_EQ(world().size(), 1) << "run this test without mpirun";
  const Mesh m = Mesh::from_string(" data = 1 , model = -1 ");
  EXPECT_EQ(m.str(), "data=1,model=1");
  EXPECT_EQ(m.axis_names(), (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(m.size(), 1);
  EXPECT_EQ(m.axis_size("model"), 1);
  EXPECT_EQ(m.axis_index("data"), 0);
  EXPECT_EQ(m.coords(), (std::vector<int>{0, 0}));
  EXPECT_TRUE(m.has_axis("model"));
  EXPECT_FALSE(m.has_axis("fsdp"));
  EXPECT_EQ(m.axis_comm("model").size(), 1);
  EXPECT_EQ(m.axis_comm("model").name(), "model");
  EXPECT_EQ(&m.comm(), &world());
  EXPECT_EQ(m, Mesh::from_model_shards(1));
  EXPECT_EQ(Mesh::from_string("x_1=1").str(), "x_1=1");
  EXPECT_NE(m, Mesh::from_string("model=1,data=1"));  // axis order matters (row-major ranks)
}

TEST(Mesh, SingleHasNoAxes) {
  const Mesh s = Mesh::single();
  EXPECT_EQ(s.size(), 1);
  EXPECT_TRUE(s.axis_names().empty());
  EXPECT_EQ(s.str(), "single");
  EXPECT_EQ(s.comm().size(), 1);
  EXPECT_EQ(s, Mesh());
  EXPECT_EQ(error_of([&] { s.axis_comm("data"); }), "[mesh] unknown axis 'data'; mesh 'single' has no axes");
}

TEST(Mesh, CollectivesOnOneDeviceAreCopies) {
  const Mesh m = Mesh::from_model_shards(1);
  Communicator& c = m.axis_comm("data");
  std::vector<float> x = {1.5f, -2.0f}, y(2);
  c.all_reduce(x.data(), 2, DType::f32, ReduceOp::sum);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f}));
  c.all_gather(x.data(), y.data(), 2, DType::f32);
  EXPECT_EQ(y, x);
  y.assign(2, 0.0f);
  c.reduce_scatter(x.data(), y.data(), 2, DType::f32, ReduceOp::max);
  EXPECT_EQ(y, x);
  y.assign(2, 0.0f);
  c.all_to_all(x.data(), y.data(), 2, DType::f32);
  EXPECT_EQ(y, x);
  CommHandle h = c.broadcast_async(x.data(), 2, DType::f32, 0);
  EXPECT_TRUE(h.done());
  h.wait();
  c.barrier();
  EXPECT_EQ(c.stats().total_calls(), 6);
  EXPECT_EQ(error_of([&] { c.broadcast(x.data(), 2, DType::f32, 1); }),
            "[comm] broadcast on 'data' (size 1): root 1 out of range [0, 1)");
}

TEST(Mesh, ErrorsNameTheProblem) {
  EXPECT_EQ(error_of([] { Mesh::from_string("data=2,model=2"); }),
            "[mesh] mesh 'data=2,model=2' has 4 devices but the world has 1 rank (launch with mpirun -np 4)");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=1,model=1").axis_size("tensor"); }),
            "[mesh] unknown axis 'tensor'; mesh 'data=1,model=1' has axes data, model");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=1,model=1").axis_index("fsdp"); }),
            "[mesh] unknown axis 'fsdp'; mesh 'data=1,model=1' has axes data, model");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=0"); }),
            "[mesh] mesh 'data=0': axis 'data' has size 0; sizes must be positive (or -1 for one inferred axis)");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=-2"); }),
            "[mesh] mesh 'data=-2': axis 'data' has size -2; sizes must be positive (or -1 for one inferred axis)");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=-1,model=-1"); }),
            "[mesh] mesh 'data=-1,model=-1': only one axis may be -1 (inferred), got 'data' and 'model'");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=x"); }),
            "[mesh] malformed mesh 'data=x': size 'x' of axis 'data' is not an integer");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=2x"); }),
            "[mesh] malformed mesh 'data=2x': size '2x' of axis 'data' is not an integer");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=1,data=1"); }),
            "[mesh] malformed mesh 'data=1,data=1': axis 'data' appears twice");
  EXPECT_EQ(error_of([] { Mesh::from_string("1d=1"); }),
            "[mesh] malformed mesh '1d=1': axis name '1d' is not an identifier (letters, digits, _)");
  EXPECT_EQ(error_of([] { Mesh::from_string(""); }),
            "[mesh] malformed mesh '': expected axis=size items separated by commas, e.g. 'data=2,model=2'; got ''");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=1,"); }),
            "[mesh] malformed mesh 'data=1,': expected axis=size items separated by commas, e.g. 'data=2,model=2'; "
            "got ''");
  EXPECT_EQ(error_of([] { Mesh::from_string("data=3,model=-1"); }),
            "[mesh] mesh 'data=3,model=-1': the other axes have 3 devices, which does not divide the world size 1, "
            "so axis 'model' cannot be inferred");
  EXPECT_EQ(error_of([] { Mesh::from_model_shards(0); }), "[mesh] n_model_shards must be positive, got 0");
  EXPECT_EQ(error_of([] { Mesh::from_model_shards(2); }),
            "[mesh] --model-shards 2 does not divide the 1 process of this run: launch a multiple of 2, e.g. mpirun -np 2 "
            "meshtrain ...");
}

TEST(Communicator, WorldWithoutMpirunIsLocal) {
  EXPECT_FALSE(launched_by_mpi());
  EXPECT_EQ(world().size(), 1);
  EXPECT_EQ(world().rank(), 0);
  std::shared_ptr<Communicator> sub = world().split(3, 0, "sub");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->name(), "sub");
}

}  // namespace
}  // namespace mt::dist
