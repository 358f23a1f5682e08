// Checkpoints: save and restore across meshes, across process counts (4 ranks -> 1 and
// 1 -> 4, through CTest fixtures), best-by-metric, keep-last, and refusal of a corrupt
// checkpoint while the previous one still loads; a background save writes the values of its
// step whatever later steps do to the live arrays, byte for byte what a foreground save writes,
// and becomes the newest only when committed.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <filesystem>
#include <fstream>
#include <thread>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/train/background_checkpoints.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/sharding_rules.h"
#include "tests/support/op_check.h"
#include "tests/support/tiny_gpt.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using dist::Mesh;
using dist::PartitionSpec;

const TinyGptConfig kConfig{};

Mesh world_mesh() {
  const int n = dist::world().size();
  return n == 4 ? Mesh::from_string("data=2,model=2") : Mesh::from_string("data=" + std::to_string(n));
}

// Parameters and AdamW state after one step, laid out by the automatic plan on `mesh`.
train::CheckpointState make_state(const Mesh& mesh, const train::ShardingPlan& plan) {
  Params params = plan.shard(tiny_gpt_init(kConfig, "single", nullptr));
  optim::Transform opt = tiny_gpt_optimizer();
  Params state = opt.init(params);
  Array ids = random_ints({kConfig.batch, kConfig.time}, 100, 0, kConfig.vocab);
  Params grads = grad([&](const Params& p) { return tiny_gpt_loss(kConfig, p, ids, ids, 0); })(params);
  params = optim::apply_updates(params, opt.update(grads, state, params));
  return train::CheckpointState{1, 0, params, state, {{"rng", {{"seed", 7}}}, {"data", {{"batch", 3}}}}};
}

// Bitwise comparison of the gathered values of two trees.
void expect_same(const Params& a, const Params& b, const std::string& what) {
  ASSERT_EQ(a.paths(), b.paths()) << what;
  for (const auto& [path, x] : a) {
    auto u = dist::to_host(x).to_doubles(), v = dist::to_host(b[path]).to_doubles();
    EXPECT_EQ(u, v) << what << " " << path;
  }
}

std::string scratch_dir(const std::string& name) {
  std::string dir = (fs::temp_directory_path() / ("mt_ckpt_" + name + "_np" + std::to_string(dist::world().size()))).string();
  if (dist::world().rank() == 0) fs::remove_all(dir);
  dist::world().barrier();
  return dir;
}

TEST(Checkpoint, RestoresOntoAnotherMesh) {
  Mesh mesh = world_mesh();
  train::ShardingPlan plan = train::auto_sharding_rules(tiny_gpt_init(kConfig, "single", nullptr), mesh, tiny_gpt_roles(kConfig));
  train::CheckpointState state = make_state(mesh, plan);
  train::CheckpointManager manager(scratch_dir("mesh"));
  std::string path = manager.save(state, mesh);
  // The same layout.
  // Parameters by the plan; optimizer slots like their parameter; the step count replicated.
  auto same = train::CheckpointManager::restore(path, mesh, [&](const std::string& group, const std::string& p) {
    if (group == "params") return plan.spec(p);
    return p.rfind("mu.", 0) == 0 || p.rfind("nu.", 0) == 0 ? plan.spec(p.substr(3)) : PartitionSpec{};
  });
  expect_same(same.params, state.params, "same mesh params");
  expect_same(same.opt_state, state.opt_state, "same mesh optimizer state");
  EXPECT_EQ(same.step, 1);
  EXPECT_EQ(same.extra["data"]["batch"], 3);
  // A different mesh (everything over data) and fully replicated.
  Mesh other = Mesh::from_string("data=" + std::to_string(dist::world().size()));
  train::ShardingOptions fsdp;
  fsdp.fsdp = true;
  fsdp.fsdp_min_elements = 1;
  train::ShardingPlan other_plan =
      train::auto_sharding_rules(tiny_gpt_init(kConfig, "single", nullptr), other, tiny_gpt_roles(kConfig), fsdp);
  auto moved = train::CheckpointManager::restore(path, other, [&](const std::string& group, const std::string& p) {
    return group == "params" ? other_plan.spec(p) : PartitionSpec{};
  });
  expect_same(moved.params, state.params, "resharded params");
  auto replicated = train::CheckpointManager::restore(path, other);
  expect_same(replicated.opt_state, state.opt_state, "replicated optimizer state");
}

TEST(Checkpoint, KeepLastBestAndCorruption) {
  Mesh mesh = world_mesh();
  train::ShardingPlan plan = train::auto_sharding_rules(tiny_gpt_init(kConfig, "single", nullptr), mesh, tiny_gpt_roles(kConfig));
  train::CheckpointState state = make_state(mesh, plan);
  const std::string dir = scratch_dir("keep");
  train::CheckpointManager manager(dir, 2);
  for (int64_t step : {1, 2, 3}) {
    state.step = step;
    manager.save(state, mesh);
  }
  std::vector<std::string> kept = manager.all();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(fs::path(kept.back()).filename().string(), "step_00000003");
  // A crash mid-save leaves only a temporary directory, never the newest checkpoint.
  // Nor does an interrupted replace's leftover (step_N.old) count as a checkpoint.
  if (dist::world().rank() == 0) {
    fs::create_directories(fs::path(dir) / ".tmp_step_00000004");
    fs::copy(kept.front(), fs::path(dir) / "step_00000009.old");
  }
  dist::world().barrier();
  EXPECT_EQ(fs::path(*manager.latest()).filename().string(), "step_00000003");
  // A newer checkpoint whose meta.json a crash left empty (a build before meta.json was synced)
  // is not resumed from: the one before it is.
  if (dist::world().rank() == 0) {
    fs::copy(kept.back(), fs::path(dir) / "step_00000005");
    std::ofstream(fs::path(dir) / "step_00000005" / "meta.json", std::ios::trunc);
  }
  dist::world().barrier();
  EXPECT_EQ(fs::path(*manager.latest()).filename().string(), "step_00000003");
  // Best by metric: replaced only by a better value; NaN (a diverged run) is never better
  // and does not break later comparisons.
  EXPECT_FALSE(manager.save_best(state, mesh, train::BestMetric::parse("max:accuracy"), std::nan("")));
  EXPECT_TRUE(manager.save_best(state, mesh, train::BestMetric::parse("max:accuracy"), 0.5));
  EXPECT_FALSE(manager.save_best(state, mesh, train::BestMetric::parse("max:accuracy"), std::nan("")));
  EXPECT_FALSE(manager.save_best(state, mesh, train::BestMetric::parse("max:accuracy"), 0.4));
  EXPECT_TRUE(manager.save_best(state, mesh, train::BestMetric::parse("max:accuracy"), 0.7));
  // Corrupt the newest: refused with the file named; the previous one still loads.
  if (dist::world().rank() == 0) {
    fs::path f = fs::path(kept.back()) / "rank_0.safetensors";
    fs::resize_file(f, fs::file_size(f) / 2);
  }
  dist::world().barrier();
  expect_error([&] { train::CheckpointManager::restore(kept.back(), mesh); }, {"rank_0.safetensors"});
  auto previous = train::CheckpointManager::restore(kept.front(), mesh);
  expect_same(previous.params, state.params, "previous checkpoint");
  expect_error([&] { train::CheckpointManager::restore(dir + "/nope", mesh); }, {"nope", "meta.json"});
}

// Cross process counts: run once with MT_CKPT_ROLE=save and again (another -np) with
// MT_CKPT_ROLE=restore on the same MT_CKPT_DIR (CTest fixtures order them).
std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(Checkpoint, BackgroundSaveWritesItsStepsValuesAndIsNewestOnlyOnceCommitted) {
  Mesh mesh = world_mesh();
  train::ShardingPlan plan = train::auto_sharding_rules(tiny_gpt_init(kConfig, "single", nullptr), mesh, tiny_gpt_roles(kConfig));
  train::CheckpointState state = make_state(mesh, plan);
  std::map<std::string, std::vector<double>> before;
  for (const auto& [path, x] : state.params) before[path] = dist::to_host(x).to_doubles();
  const std::string dir = scratch_dir("background"), fg_dir = scratch_dir("foreground");
  train::CheckpointManager manager(dir, 0), foreground(fg_dir, 0);
  foreground.save(make_state(mesh, plan), mesh);
  {
    train::BackgroundCheckpoints writer(mesh, true);
    writer.save(manager, state);
    EXPECT_TRUE(writer.in_flight());
    EXPECT_TRUE(writer.last_in_background());
    EXPECT_FALSE(manager.latest().has_value());  // not the newest before its commit
    // The next step rewrites the live parameters in place: the file keeps step 1's values.
    for (auto& [path, x] : state.params) {
      Array local = dist::local_view(x);
      std::memset(local.raw(), 0, local.nbytes());
    }
    writer.complete();
    EXPECT_FALSE(writer.in_flight());
  }
  ASSERT_TRUE(manager.latest().has_value());
  const train::CheckpointState got = train::CheckpointManager::restore(*manager.latest(), mesh);
  for (const auto& [path, x] : got.params) EXPECT_EQ(dist::to_host(x).to_doubles(), before[path]) << path;
  const std::string rank_file = "rank_" + std::to_string(dist::world().rank()) + ".safetensors";
  EXPECT_EQ(file_bytes(fs::path(*manager.latest()) / rank_file),
            file_bytes(fs::path(*foreground.latest()) / rank_file));
  EXPECT_EQ(file_bytes(fs::path(*manager.latest()) / "meta.json"), file_bytes(fs::path(*foreground.latest()) / "meta.json"));
}

// A background save is committed at the first poll after every rank's file is written (the
// trainer polls after every step; several processes agree in one all-reduce per poll), so a
// crash before the next save loses nothing; until then it is not the newest.
TEST(Checkpoint, ABackgroundSaveIsCommittedOnceWrittenOnEveryRank) {
  Mesh mesh = world_mesh();
  train::ShardingPlan plan = train::auto_sharding_rules(tiny_gpt_init(kConfig, "single", nullptr), mesh, tiny_gpt_roles(kConfig));
  const train::CheckpointState state = make_state(mesh, plan);
  train::CheckpointManager manager(scratch_dir("poll"), 0);
  train::BackgroundCheckpoints writer(mesh, true);
  writer.save(manager, state);
  int polls = 0;
  for (; polls < 2000 && writer.in_flight(); ++polls) {
    if (writer.in_flight()) EXPECT_FALSE(manager.latest().has_value()) << "newest before its commit";
    writer.commit_if_written();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(writer.in_flight()) << "the written save was not committed within 10 s";
  EXPECT_TRUE(manager.latest().has_value());
  if (dist::world().rank() == 0)
    std::cout << "  committed at poll " << polls << " on " << dist::world().size() << " process(es)\n";
  writer.complete();  // nothing left in flight: a no-op
  EXPECT_TRUE(manager.latest().has_value());
}

TEST(CheckpointWorlds, SaveOrRestore) {
  const char* role = std::getenv("MT_CKPT_ROLE");
  const char* dir = std::getenv("MT_CKPT_DIR");
  if (!role || !dir) GTEST_SKIP() << "set MT_CKPT_ROLE and MT_CKPT_DIR";
  Mesh mesh = world_mesh();
  train::ShardingPlan plan = train::auto_sharding_rules(tiny_gpt_init(kConfig, "single", nullptr), mesh, tiny_gpt_roles(kConfig));
  train::CheckpointState expected = make_state(mesh, plan);
  if (std::string(role) == "save") {
    if (dist::world().rank() == 0) fs::remove_all(dir);
    dist::world().barrier();
    train::CheckpointManager(dir).save(expected, mesh);
    return;
  }
  train::CheckpointManager manager(dir);
  ASSERT_TRUE(manager.latest().has_value());
  auto got = train::CheckpointManager::restore(*manager.latest(), mesh, [&](const std::string& group, const std::string& p) {
    return group == "params" ? plan.spec(p) : PartitionSpec{};
  });
  // Same values; summation order may differ between worlds, so compare with a tolerance.
  for (const auto& [path, x] : expected.params) {
    auto u = dist::to_host(x).to_doubles(), v = dist::to_host(got.params[path]).to_doubles();
    double err = 0;
    for (size_t i = 0; i < u.size(); ++i) err = std::max(err, std::abs(u[i] - v[i]));
    EXPECT_LE(err, 1e-5) << path;
  }
  EXPECT_EQ(got.opt_state.paths(), expected.opt_state.paths());
}

}  // namespace
}  // namespace mt::testing
