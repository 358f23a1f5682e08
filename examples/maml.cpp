// MAML (Finn et al. 2017) on few-shot sinusoid regression: each task is y = A sin(x - φ)
// with its own amplitude and phase, seen through K support points. The loss adapts the
// parameters to each task with one SGD step on the support points (an inner `grad`) and
// scores the adapted parameters on query points; the Trainer differentiates that loss, so
// the meta-gradient flows through the inner gradient (second order, like torch's
// create_graph=True). The Predictor then adapts to unseen tasks.
//
//   example_maml [steps=1000] [workdir=runs/maml]
#include <cmath>
#include <numeric>
#include <numbers>

#include "meshtrain/meshtrain.h"

using namespace mt;

constexpr int64_t kShots = 10;          // support points per task, and as many query points
constexpr int64_t kTasksPerBatch = 16;  // the meta-batch
constexpr double kInnerLr = 0.01;       // the inner SGD step
constexpr double kOuterLr = 3e-3;       // Adam on the meta-gradient

// Tasks drawn as in the paper: amplitude in [0.1, 5], phase in [0, π]. A task also names the
// random stream its points come from (one per task of every task set).
std::shared_ptr<const data::Dataset> make_tasks(int64_t n, uint64_t seed) {
  std::vector<data::Example> tasks;
  for (int64_t i = 0; i < n; ++i) {
    const RngKey key = RngKey{seed, 0}.fold_in(uint64_t(i));
    tasks.push_back({{"amplitude", 0.1 + 4.9 * uniform_at(key, 0)},
                     {"phase", std::numbers::pi * uniform_at(key, 1)},
                     {"points_seed", int64_t(seed << 32 | uint64_t(i))}});
  }
  return data::make_dataset(std::move(tasks));
}

// collate: each task's support and query points, x uniform in [-5, 5]: (tasks, K, 1) arrays.
train::Batch collate(const std::vector<data::Example>& tasks) {
  std::vector<float> xs, ys;  // per task: K support points, then K query points
  for (const data::Example& t : tasks) {
    const RngKey key{uint64_t(t.as_int("points_seed")), 1};
    for (int64_t i = 0; i < 2 * kShots; ++i) {
      const float x = -5.0f + 10.0f * uniform_at(key, uint64_t(i));
      xs.push_back(x);
      ys.push_back(float(t.as_float("amplitude") * std::sin(x - t.as_float("phase"))));
    }
  }
  const int64_t n = int64_t(tasks.size());
  Array x = Array::from_vector(xs, {n, 2 * kShots, 1}), y = Array::from_vector(ys, {n, 2 * kShots, 1});
  return {{"x_support", slice(x, 1, 0, kShots)}, {"y_support", slice(y, 1, 0, kShots)},
          {"x_query", slice(x, 1, kShots, 2 * kShots)}, {"y_query", slice(y, 1, kShots, 2 * kShots)}};
}

// The regressor of the paper: 1 -> 40 -> 40 -> 1 with ReLUs. Weights have torch.nn.Linear's
// scale (std 1/sqrt(3·in)): larger ones make the inner step overshoot.
Params init_mlp(const RngKey& key) {
  const int64_t sizes[] = {1, 40, 40, 1};
  Params p;
  for (int i = 0; i < 3; ++i) {
    const int64_t in = sizes[i], out = sizes[i + 1];
    p.set(std::to_string(i) + ".w", random_normal(key.fold_in(uint64_t(i)), {in, out}, DType::f32, 0.0, 1 / std::sqrt(3.0 * in)));
    p.set(std::to_string(i) + ".b", Array::zeros({out}));
  }
  return p;
}

Array mlp(const Params& p, const Array& x) {  // x: (points, 1)
  Array h = relu(add(matmul(x, p["0.w"]), p["0.b"]));
  h = relu(add(matmul(h, p["1.w"]), p["1.b"]));
  return add(matmul(h, p["2.w"]), p["2.b"]);
}

// One SGD step on a task's support points. Inside a traced loss, `grad` records its own
// backward pass, so whatever is computed from the adapted parameters differentiates
// through it.
Params adapt(const Params& p, const Array& x_support, const Array& y_support) {
  Params g = grad([&](const Params& q) { return mse_loss(mlp(q, x_support), y_support); })(p);
  Params adapted;
  for (const auto& [path, value] : p) adapted.set(path, sub(value, mul(g[path], kInnerLr)));
  return adapted;
}

Array task(const Array& a, int64_t i) { return squeeze(slice(a, 0, i, i + 1), 0); }  // (K, 1) of task i

// Task i's error on its query points, after one adaptation step on its support points
// (or, to compare, without adapting).
Array query_error(const Params& p, const train::Batch& b, int64_t i, bool adapt_first = true) {
  Params q = adapt_first ? adapt(p, task(b["x_support"], i), task(b["y_support"], i)) : p;
  return mse_loss(mlp(q, task(b["x_query"], i)), task(b["y_query"], i));
}

// loss: the query error after adaptation, averaged over the meta-batch.
Array maml_loss(const Params& p, const train::Batch& b) {
  const int64_t n = b["x_support"].dim(0);
  Array total = query_error(p, b, 0);
  for (int64_t i = 1; i < n; ++i) total = add(total, query_error(p, b, i));
  return div(total, double(n));
}

int main(int argc, char** argv) {
  return dist::run_guarded([&] {
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 1000;
    MT_CHECK(steps > 0, "steps must be positive, got ", steps);
    const std::string workdir = argc > 2 ? argv[2] : "runs/maml";

    train::DeployerOptions options;
    options.workdir = workdir;  // metrics.jsonl and TensorBoard events
    train::Deployer deployer(options);
    auto train_tasks = make_tasks(steps * kTasksPerBatch, 1);
    auto test_tasks = make_tasks(100, 2);  // unseen amplitudes and phases
    auto loss_fn = [](const Params& p, const train::Batch& b, const RngKey&) { return maml_loss(p, b); };
    train::Trainer trainer(deployer, collate, loss_fn, init_mlp(deployer.init_key()),
                           optim::adam(optim::constant_schedule(kOuterLr)));

    // predict: each unseen task's query error with the parameters as they are and after
    // one adaptation step on its support points.
    train::Predictor<std::pair<double, double>> predictor(
        deployer, collate,
        [](const Params& p, const train::Batch& b) {
          std::vector<Array> before, after;
          for (int64_t i = 0; i < b["x_support"].dim(0); ++i) {
            before.push_back(query_error(p, b, i, /*adapt_first=*/false));
            after.push_back(query_error(p, b, i));
          }
          return train::Batch{{"before", stack(before, 0)}, {"after", stack(after, 0)}};
        },
        [](const train::Batch& out) {
          std::vector<double> before = out["before"].to_doubles(), after = out["after"].to_doubles();
          std::vector<std::pair<double, double>> errors;
          for (size_t i = 0; i < before.size(); ++i) errors.emplace_back(before[i], after[i]);
          return errors;
        });
    auto report = [&](const std::string& when) {
      double before = 0, after = 0;
      for (auto [b, a] : predictor.predict(trainer.params(), test_tasks, kTasksPerBatch)) before += b, after += a;
      deployer.log(when + ": query MSE on 100 unseen tasks " + std::to_string(before / 100) + ", after one step on " +
                   std::to_string(kShots) + " support points " + std::to_string(after / 100));
    };
    report("before meta-training");

    train::FitOptions fit;
    fit.per_device_batch_size = kTasksPerBatch / deployer.data_size();
    fit.max_steps = steps;
    fit.save_last = false;
    std::vector<double> losses = trainer.fit(train_tasks, fit).losses;

    const size_t k = std::max<size_t>(1, losses.size() / 10);  // a meta-batch is a few random tasks: average
    const double first = std::accumulate(losses.begin(), losses.begin() + k, 0.0) / k,
                 last = std::accumulate(losses.end() - k, losses.end(), 0.0) / k;
    deployer.log("meta-loss " + std::to_string(first) + " -> " + std::to_string(last) + " (mean of the first and last " +
                 std::to_string(k) + " steps)");
    report("after meta-training");
    if (!(last < first)) deployer.log("error: the loss did not fall");
    return last < first ? 0 : 1;
  });
}
