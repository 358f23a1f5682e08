// The automatic sharding rules: the expected column/row pairing per path on a small GPT's
// declared roles, FSDP and regex overrides, readable plans, clear errors — and training
// under the automatic plan on a data x model mesh equals the one-device run.
#include <gtest/gtest.h>

#include <iostream>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/train/sharding_rules.h"
#include "tests/support/op_check.h"
#include "tests/support/tiny_gpt.h"

namespace mt::testing {
namespace {

using dist::Mesh;
using dist::PartitionSpec;
using train::auto_sharding_rules;

const TinyGptConfig kConfig{};

TEST(ShardingRules, MegatronPairingFromDeclaredRoles) {
  Params host = tiny_gpt_init(kConfig, "single", nullptr);
  Mesh mesh = dist::world().size() == 4 ? Mesh::from_string("data=2,model=2") : Mesh::from_string("model=" + std::to_string(dist::world().size()));
  train::ShardingPlan plan = auto_sharding_rules(host, mesh, tiny_gpt_roles(kConfig));
  if (dist::world().rank() == 0) std::cout << plan.table();
  if (mesh.axis_size("model") == 1) return;
  const PartitionSpec column{"", "model"}, row{"model", ""}, none{"", ""};
  EXPECT_EQ(plan.spec("wte"), row);  // vocab
  EXPECT_EQ(plan.spec("head.weight"), column);
  for (int l = 0; l < kConfig.layers; ++l) {
    std::string b = "h." + std::to_string(l) + ".";
    for (const char* n : {"q", "k", "v"}) EXPECT_EQ(plan.spec(b + "attn." + n + ".weight"), column) << n;
    EXPECT_EQ(plan.spec(b + "attn.proj.weight"), row);
    EXPECT_EQ(plan.spec(b + "mlp.fc.weight"), column);
    EXPECT_EQ(plan.spec(b + "mlp.proj.weight"), row);
    EXPECT_TRUE(plan.spec(b + "attn.q.bias").is_replicated());
    EXPECT_TRUE(plan.spec(b + "ln.weight").is_replicated());
  }
}

TEST(ShardingRules, FsdpOverridesAndErrors) {
  Params host = tiny_gpt_init(kConfig, "single", nullptr);
  const int n = dist::world().size();
  Mesh mesh = Mesh::from_string("data=" + std::to_string(n));
  train::ShardingOptions fsdp;
  fsdp.fsdp = true;
  fsdp.fsdp_min_elements = 256;
  fsdp.overrides = {{"h\\.0\\..*", PartitionSpec{}}, {"h\\..*fc\\.weight", PartitionSpec{"", "data"}}};
  train::ShardingPlan plan = auto_sharding_rules(host, mesh, tiny_gpt_roles(kConfig), fsdp);
  if (dist::world().rank() == 0) std::cout << plan.table();
  EXPECT_TRUE(plan.spec("h.0.mlp.fc.weight").is_replicated());               // the first override wins
  EXPECT_EQ(plan.spec("h.1.mlp.fc.weight"), (PartitionSpec{"", "data"}));  // the second applies
  if (n > 1) {
    EXPECT_EQ(plan.spec("h.1.mlp.proj.weight"), (PartitionSpec{"data", ""}));  // largest dim (64)
  }
  EXPECT_TRUE(plan.spec("h.1.ln.weight").is_replicated());
  expect_error([&] { plan.spec("nope"); }, {"'nope'"});
  train::ShardingOptions bad;
  bad.overrides = {{"(", PartitionSpec{}}};
  expect_error([&] { auto_sharding_rules(host, mesh, {}, bad); }, {"invalid override regex"});
}

TEST(ShardingRules, AutomaticPlanTrainsLikeOneDevice) {
  const int n = dist::world().size();
  Mesh mesh = n == 4 ? Mesh::from_string("data=2,model=2") : Mesh::from_string("data=" + std::to_string(n));
  Params host = tiny_gpt_init(kConfig, "single", nullptr);
  train::ShardingPlan plan = auto_sharding_rules(host, mesh, tiny_gpt_roles(kConfig));
  Array ids = random_ints({kConfig.batch, kConfig.time}, 100, 0, kConfig.vocab);
  Array labels = random_ints({kConfig.batch, kConfig.time}, 200, 0, kConfig.vocab);
  auto run = [&](Params params, const Array& x, const Array& y) {
    optim::Transform opt = tiny_gpt_optimizer();
    Params state = opt.init(params);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      auto [loss, grads] = value_and_grad([&](const Params& p) { return tiny_gpt_loss(kConfig, p, x, y, uint64_t(s)); })(params);
      params = optim::apply_updates(params, opt.update(grads, state, params));
      losses.push_back(dist::to_host(loss).item());
    }
    return std::make_pair(losses, params);
  };
  auto [ref_losses, ref_params] = run(host, ids, labels);
  auto [losses, params] = run(plan.shard(host), dist::shard(ids, mesh, PartitionSpec{"data", ""}),
                              dist::shard(labels, mesh, PartitionSpec{"data", ""}));
  double err = 0;
  for (size_t i = 0; i < losses.size(); ++i) err = std::max(err, std::abs(losses[i] - ref_losses[i]));
  for (const auto& [path, w] : ref_params) {
    auto a = w.to_doubles(), b = dist::to_host(params[path]).to_doubles();
    for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
  }
  if (dist::world().rank() == 0) std::cout << "  [max err] automatic plan on " << mesh.str() << ": " << err << "\n";
  EXPECT_LE(err, 2e-5);
}

}  // namespace
}  // namespace mt::testing
