// Post-training losses against their references: DPO's loss, rewards and gradient against
// TRL's own DPOTrainer.dpo_loss (sigmoid, conservative, IPO); sequence log-probabilities and
// the DPO loss from logits against a PyTorch twin (value and gradient); and, on a small
// GPT-2, the first step of DPO — the policy equal to its reference — is ln 2 with every
// reward 0 for each way of holding the reference, with the gradient
// −β/2 · mean ∇(log π(y_w) − log π(y_l)). Distillation's loss from logits against a PyTorch
// twin, and the chunked path through two GPT-2s of different sizes equal to the whole one.
// GRPO's objective, gradient, kl and clip_ratio against TRL's GRPOTrainer.compute_loss, with
// and without a sampling policy apart; group advantages against their definition.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/posttrain/distillation.h"
#include "meshtrain/posttrain/dpo.h"
#include "meshtrain/posttrain/grpo.h"
#include "meshtrain/posttrain/preference_data.h"
#include "meshtrain/posttrain/token_logprobs.h"
#include "meshtrain/train/step_metrics.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using posttrain::DpoLossType;
using posttrain::DpoOptions;

// TRL's answer for `mode` (tests/python/trl_losses.py) on the tensors of `in`.
json trl(const std::string& mode, const json& in) {
  const fs::path path = fs::temp_directory_path() / ("mt_trl_" + mode + "_" + std::to_string(getpid()) + ".json");
  std::ofstream(path) << in.dump();
  const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/trl_losses.py " + mode + " " +
                          path.string();
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = p ? pclose(p) : -1;
  fs::remove(path);
  EXPECT_EQ(status, 0) << cmd;
  return json::parse(out);
}

Array vec(const std::vector<double>& v) { return Array::from_vector(v, {int64_t(v.size())}); }

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

struct DpoCase {
  const char* name;
  DpoLossType loss;
  double label_smoothing;
};

TEST(DpoOracle, LossRewardsMetricsAndGradientEqualTrl) {
  // Sums over responses of 3..9 tokens.
  const std::vector<double> pc{-10, -12.5, -8, -20, -7.25}, pr{-11, -12, -9.5, -18, -7.5};
  const std::vector<double> rc{-10.5, -12, -8.5, -19, -7.0}, rr{-10.8, -12.2, -9, -18.5, -8.0};
  const std::vector<double> nc{4, 5, 3, 9, 6}, nr{5, 4, 3, 8, 7};
  for (const DpoCase& c : {DpoCase{"sigmoid", DpoLossType::sigmoid, 0.0}, DpoCase{"conservative", DpoLossType::sigmoid, 0.1},
                           DpoCase{"ipo", DpoLossType::ipo, 0.0}}) {
    SCOPED_TRACE(c.name);
    DpoOptions o;
    o.beta = 0.1;
    o.loss = c.loss;
    o.label_smoothing = c.label_smoothing;
    const bool ipo = c.loss == DpoLossType::ipo;
    // TRL averages the log-probabilities over tokens for IPO before dpo_loss sees them.
    auto per = [&](const std::vector<double>& v, const std::vector<double>& n) {
      std::vector<double> out = v;
      if (ipo)
        for (size_t i = 0; i < v.size(); ++i) out[i] /= n[i];
      return out;
    };
    const json ref = trl("dpo", {{"beta", o.beta},
                                 {"loss_type", ipo ? "ipo" : "sigmoid"},
                                 {"label_smoothing", o.label_smoothing},
                                 {"policy_chosen", per(pc, nc)},
                                 {"policy_rejected", per(pr, nr)},
                                 {"ref_chosen", per(rc, nc)},
                                 {"ref_rejected", per(rr, nr)}});
    Params p;
    p.set("chosen", vec(pc));
    p.set("rejected", vec(pr));
    const posttrain::PairLogps reference{vec(rc), vec(rr), vec(nc), vec(nr)};
    train::MetricRecorder recorder;
    auto [loss, grads] = value_and_grad([&](const Params& q) {
      return posttrain::dpo_loss({q["chosen"], q["rejected"], vec(nc), vec(nr)}, reference, o);
    })(p);
    const auto metrics = recorder.take();
    const std::vector<double> losses = ref["losses"], cr = ref["chosen_rewards"], rj = ref["rejected_rewards"];
    const double loss_err = std::abs(loss.item() - mean_of(losses));
    std::cout << c.name << ": loss " << loss.item() << " vs TRL " << mean_of(losses) << " (|err| " << loss_err << ")\n";
    EXPECT_LT(loss_err, 1e-6);
    const std::vector<double> gc = ref["grad_chosen"], gr = ref["grad_rejected"];
    const std::vector<double> ours_gc = grads["chosen"].to_doubles(), ours_gr = grads["rejected"].to_doubles();
    double grad_err = 0;
    // IPO's TRL gradient is with respect to the token means: ours, with respect to the sums, is it / n.
    for (size_t i = 0; i < gc.size(); ++i)
      grad_err = std::max({grad_err, std::abs(ours_gc[i] - gc[i] / (ipo ? nc[i] : 1.0)),
                           std::abs(ours_gr[i] - gr[i] / (ipo ? nr[i] : 1.0))});
    std::cout << "  gradient max |err| " << grad_err << "\n";
    EXPECT_LT(grad_err, 1e-6);
    // The metrics are TRL's definitions over TRL's rewards.
    std::vector<double> margins, wins;
    for (size_t i = 0; i < cr.size(); ++i) margins.push_back(cr[i] - rj[i]), wins.push_back(cr[i] > rj[i] ? 1.0 : 0.0);
    EXPECT_NEAR(metrics.at("rewards/chosen").item(), mean_of(cr), 1e-6);
    EXPECT_NEAR(metrics.at("rewards/rejected").item(), mean_of(rj), 1e-6);
    EXPECT_NEAR(metrics.at("rewards/margins").item(), mean_of(margins), 1e-6);
    EXPECT_NEAR(metrics.at("rewards/accuracies").item(), mean_of(wins), 1e-7);
    EXPECT_NEAR(metrics.at("logps/chosen").item(), mean_of(per(pc, nc)), 1e-5);
    EXPECT_NEAR(metrics.at("logps/rejected").item(), mean_of(per(pr, nr)), 1e-5);
  }
}

TEST(DpoOracle, FromLogitsValueAndGradientMatchPyTorch) {
  // Policy and reference logits for chosen and rejected rows; labels with prompt/padding -100.
  const int64_t b = 3, t = 6, v = 11;
  Array labels_c = random_ints({b, t}, 1, 0, v), labels_r = random_ints({b, t}, 2, 0, v);
  std::vector<int64_t> lc = labels_c.to_ints(), lr = labels_r.to_ints();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < t; ++j) {
      if (j < 1 + i % 2) lc[size_t(i * t + j)] = lr[size_t(i * t + j)] = -100;  // the prompt
      if (j >= t - i) lr[size_t(i * t + j)] = -100;                             // padding
    }
  labels_c = Array::from_vector(lc, {b, t});
  labels_r = Array::from_vector(lr, {b, t});
  DpoOptions o;
  o.beta = 0.2;
  check_against_torch(
      "dpo from logits",
      [&](const std::vector<Array>& x) {
        const posttrain::PairLogps policy{posttrain::sequence_logprobs(x[0], x[4]), posttrain::sequence_logprobs(x[1], x[5]),
                                          Array(), Array()};
        const posttrain::PairLogps reference{posttrain::sequence_logprobs(x[2], x[4]),
                                             posttrain::sequence_logprobs(x[3], x[5]), Array(), Array()};
        return posttrain::dpo_loss(policy, reference, o);
      },
      "import torch.nn.functional as F\n"
      "def seq(logits, labels):\n"
      "    mask = labels != -100\n"
      "    lp = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)\n"
      "    return (lp * mask).sum(-1)\n"
      "h = (seq(x0, x4) - seq(x2, x4).detach()) - (seq(x1, x5) - seq(x3, x5).detach())\n"
      "out = -F.logsigmoid(0.2 * h).mean()\n",
      {random_normal({b, t, v}, 3), random_normal({b, t, v}, 4), random_normal({b, t, v}, 5), random_normal({b, t, v}, 6),
       labels_c, labels_r});
}

// A small GPT-2 and a batch of preference pairs drawn from its vocabulary.
struct SmallDecoder {
  std::shared_ptr<models::PretrainedModel> model;
  std::shared_ptr<const data::Dataset> pairs;
};

SmallDecoder small_decoder(bool lora) {
  nlohmann::json c = models::model_spec("gpt2").small_config(64, 32, 0);
  c["n_layer"] = 2, c["n_embd"] = 32, c["n_head"] = 2;
  auto model = std::make_shared<models::PretrainedModel>(models::init_model(c));
  if (lora) {
    models::LoraOptions lo;
    lo.rank = 4, lo.alpha = 8;
    models::add_lora(*model, lo, RngKey{7, 0});
  }
  std::vector<data::Example> ex;
  std::mt19937 rng(11);
  auto ids = [&](int n) {
    std::vector<int64_t> v;
    for (int i = 0; i < n; ++i) v.push_back(int64_t(rng() % 63) + 1);
    return v;
  };
  for (int i = 0; i < 4; ++i)
    ex.push_back(posttrain::preference_example({ids(3 + i), ids(2 + i % 3), ids(4 - i % 2)}, 12, 0));
  return {model, data::make_dataset(ex)};
}

train::Batch batch_of(const data::Dataset& d) {
  std::vector<data::Example> ex;
  for (int64_t i = 0; i < d.size(); ++i) ex.push_back(d.get(i));
  return posttrain::preference_collate()(ex);
}

TEST(DpoModel, FirstStepIsLn2WithZeroRewardsForEveryReference) {
  train::Deployer deployer({.seed = 1, .workdir = (fs::temp_directory_path() / "mt_dpo_first").string(), .verbose = false});
  DpoOptions o;
  o.beta = 0.5;
  for (const char* kind : {"adapters_off", "frozen_copy", "precomputed"}) {
    SCOPED_TRACE(kind);
    SmallDecoder s = small_decoder(std::string(kind) == "adapters_off");
    posttrain::DpoReference ref;
    std::shared_ptr<const data::Dataset> pairs = s.pairs;
    if (std::string(kind) == "frozen_copy") ref = posttrain::DpoReference::frozen_copy(s.model->params, nullptr);
    if (std::string(kind) == "precomputed") {
      ref.kind = posttrain::DpoReference::Kind::precomputed;
      pairs = posttrain::with_reference_logps(pairs, *s.model, s.model->params, deployer, 2);
    }
    const train::LossFn loss = posttrain::dpo_loss_fn(s.model, ref, o);
    const train::Batch batch = batch_of(*pairs);
    train::MetricRecorder recorder;
    auto [value, grads] = value_and_grad([&](const Params& p) { return loss(p, batch, RngKey{3, 0}, true); })(s.model->params);
    const auto m = recorder.take();
    std::cout << kind << ": first loss " << value.item() << " (ln 2 = " << std::log(2.0) << ")\n";
    EXPECT_NEAR(value.item(), std::log(2.0), 1e-6);
    for (const char* name : {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"})
      EXPECT_NEAR(m.at(name).item(), 0.0, 1e-6) << name;
    if (std::string(kind) != "frozen_copy") continue;
    // At h = 0 the sigmoid loss's gradient is −β/2 · mean ∇(log π(y_w) − log π(y_l)).
    auto [_, expected] = value_and_grad([&](const Params& p) {
      const posttrain::PairLogps l = posttrain::pair_logps(*s.model, p, batch, RngKey{3, 0}, false);
      return mul(mean(sub(l.chosen, l.rejected)), scalar_like(l.chosen, -o.beta / 2));
    })(s.model->params);
    double err = 0, scale = 0;
    for (const auto& [path, g] : grads) {
      err = std::max(err, max_abs_diff(g, expected[path]));
      for (double x : expected[path].to_doubles()) scale = std::max(scale, std::abs(x));
    }
    std::cout << "  first-step gradient max |err| " << err << " (max |grad| " << scale << ")\n";
    EXPECT_LT(err, 1e-6 + 1e-5 * scale);
  }
}

// preference_collate(pad_multiple) cuts both sides after the last response token of either
// (rounded up):
// the columns kept are the full-length batch's first ones, and the log-probabilities of the
// pairs are the same, since no earlier position of a causal decoder sees the columns cut.
TEST(DpoModel, BatchesCutAfterTheirLastTargetGiveTheFullLengthLogps) {
  SmallDecoder s = small_decoder(false);
  std::vector<data::Example> ex;
  for (int64_t i = 0; i < s.pairs->size(); ++i) ex.push_back(s.pairs->get(i));
  const train::Batch full = posttrain::preference_collate()(ex), cut = posttrain::preference_collate(4)(ex);
  for (const char* side : {"chosen", "rejected"}) {
    const std::string ids = std::string(side) + "_input_ids", labels = std::string(side) + "_labels";
    const int64_t width = cut[ids].dim(1);
    std::cout << side << ": " << width << " of " << full[ids].dim(1) << " columns kept\n";
    EXPECT_LT(width, full[ids].dim(1)) << side;
    EXPECT_EQ(width % 4, 0) << side;
    EXPECT_EQ(cut[labels].dim(1), width);
    EXPECT_EQ(max_abs_diff(cut[ids], slice(full[ids], 1, 0, width)), 0.0) << side;
    EXPECT_EQ(max_abs_diff(cut[labels], slice(full[labels], 1, 0, width)), 0.0) << side;
    // Everything cut is padding without a target.
    for (double v : slice(full[labels], 1, width, full[labels].dim(1)).to_doubles()) EXPECT_EQ(v, -100.0) << side;
  }
  const posttrain::PairLogps a = posttrain::pair_logps(*s.model, s.model->params, full, RngKey{3, 0}, false);
  const posttrain::PairLogps b = posttrain::pair_logps(*s.model, s.model->params, cut, RngKey{3, 0}, false);
  const double err = std::max(max_abs_diff(a.chosen, b.chosen), max_abs_diff(a.rejected, b.rejected));
  std::cout << "  log-probabilities of cut vs full-length batches: max |err| " << err << "\n";
  EXPECT_LT(err, 1e-5);
  EXPECT_EQ(max_abs_diff(a.chosen_tokens, b.chosen_tokens), 0.0);
  EXPECT_EQ(max_abs_diff(a.rejected_tokens, b.rejected_tokens), 0.0);
}

TEST(DpoModel, PreferenceExamplesTargetOnlyTheResponses) {
  bool truncated = true;
  data::Example e = posttrain::preference_example({{5, 6, 7}, {8, 9}, {10}}, 6, 0, &truncated);
  EXPECT_FALSE(truncated);
  EXPECT_EQ(e.tokens("chosen_tokens"), (std::vector<int64_t>{5, 6, 7, 8, 9, 0, 0}));
  EXPECT_EQ(e.tokens("chosen_targets"), (std::vector<int64_t>{-100, -100, -100, 8, 9, -100, -100}));
  EXPECT_EQ(e.tokens("rejected_tokens"), (std::vector<int64_t>{5, 6, 7, 10, 0, 0, 0}));
  EXPECT_EQ(e.tokens("rejected_targets"), (std::vector<int64_t>{-100, -100, -100, 10, -100, -100, -100}));
  // Too long: the prompt keeps its end (half the sequence), the responses their start.
  e = posttrain::preference_example({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10}, {11}}, 5, 0, &truncated);
  EXPECT_TRUE(truncated);
  EXPECT_EQ(e.tokens("chosen_tokens"), (std::vector<int64_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(e.tokens("rejected_tokens"), (std::vector<int64_t>{4, 5, 6, 11, 0, 0}));
  EXPECT_EQ(error_of([] { posttrain::preference_example({{1}, {}, {2}}, 5, 0); }),
            "[dpo] a preference pair needs a chosen and a rejected response");
}


// ---------------------------------------------------------------- distillation

TEST(DistillOracle, FromLogitsValueAndGradientMatchPyTorch) {
  const int64_t b = 2, t = 5, v = 13;
  std::vector<int64_t> l = random_ints({b, t}, 21, 0, v).to_ints();
  l[0] = l[1] = l[size_t(t + 4)] = -100;  // a prompt and padding
  posttrain::DistillOptions o;
  o.temperature = 2.5;
  o.alpha = 0.7;
  check_against_torch(
      "distillation from logits",
      [&](const std::vector<Array>& x) { return posttrain::distillation_loss_from_logits(x[0], x[1], x[2], o); },
      "import torch.nn.functional as F\n"
      "T, a = 2.5, 0.7\n"
      "mask = (x2 != -100).double()\n"
      "lpt = torch.log_softmax(x1.detach().double() / T, -1)\n"
      "lps = torch.log_softmax(x0.double() / T, -1)\n"
      "kl = ((lpt.exp() * (lpt - lps)).sum(-1) * mask).sum() / mask.sum()\n"
      "ce = F.cross_entropy(x0.double().reshape(-1, x0.shape[-1]), x2.reshape(-1), ignore_index=-100)\n"
      "out = (a * T * T * kl + (1 - a) * ce).float()\n",
      {random_normal({b, t, v}, 22, DType::f32, 2.0), random_normal({b, t, v}, 23, DType::f32, 2.0),
       Array::from_vector(l, {b, t})});
}

std::shared_ptr<models::PretrainedModel> gpt2_of(int64_t width, int64_t layers, int64_t vocab, uint64_t seed) {
  nlohmann::json c = models::model_spec("gpt2").small_config(vocab, 32, 0);
  c["n_layer"] = layers, c["n_embd"] = width, c["n_head"] = 2;
  models::PretrainedOptions po;
  po.init_key = RngKey{seed, 0};
  return std::make_shared<models::PretrainedModel>(models::init_model(c, po));
}

TEST(DistillModel, ChunkedTeacherAndStudentEqualTheWholeLogits) {
  auto teacher = gpt2_of(48, 3, 64, 1), student = gpt2_of(16, 1, 64, 2);
  const Array ids = random_ints({3, 10}, 5, 0, 64);
  std::vector<int64_t> l = random_ints({3, 10}, 6, 0, 64).to_ints();
  for (int i = 0; i < 4; ++i) l[size_t(i)] = -100;
  const Array labels = Array::from_vector(l, {3, 10});
  models::DecoderInputs in;
  in.input_ids = ids;
  posttrain::DistillOptions o;
  o.temperature = 2.0, o.alpha = 0.5;
  // 64 logits per chunk: one position of 3 rows at a time, 10 chunks.
  auto [chunked, g1] = value_and_grad([&](const Params& p) {
    return posttrain::distillation_loss(*student, p, *teacher, teacher->params, in, labels, RngKey{0, 0}, false, o, 3 * 64);
  })(student->params);
  auto [whole, g2] = value_and_grad([&](const Params& p) {
    Array zt;
    {
      autodiff::NoGradGuard no_grad;
      zt = teacher->decoder_logits(teacher->params, in, RngKey{0, 0}, false);
    }
    return posttrain::distillation_loss_from_logits(student->decoder_logits(p, in, RngKey{0, 0}, false), zt, labels, o);
  })(student->params);
  double err = 0;
  for (const auto& [path, g] : g1) err = std::max(err, max_abs_diff(g, g2[path]));
  std::cout << "chunked " << chunked.item() << " vs whole " << whole.item() << ", gradient max |err| " << err << "\n";
  EXPECT_NEAR(chunked.item(), whole.item(), 1e-5);
  EXPECT_LT(err, 1e-5);
  expect_error([&] { posttrain::check_teacher(*gpt2_of(16, 1, 128, 3), *student); },
               {"[distill] the teacher", "has a vocabulary of 128 ids and the student", "one of 64"});
}


// ---------------------------------------------------------------- GRPO

std::vector<std::vector<double>> rows_of(const Array& a) {
  const std::vector<double> v = a.to_doubles();
  std::vector<std::vector<double>> out(size_t(a.dim(0)));
  for (int64_t i = 0; i < a.dim(0); ++i) out[size_t(i)].assign(v.begin() + i * a.dim(1), v.begin() + (i + 1) * a.dim(1));
  return out;
}

TEST(GrpoOracle, ObjectiveGradientKlAndClipRatioEqualTrl) {
  const int64_t n = 4, t = 6;
  const Array logps = random_uniform({n, t}, 31, -3.0, -0.1);
  // Mask: completions of 6, 4, 5 and 2 tokens.
  std::vector<double> mask(size_t(n * t), 0.0);
  const int lengths[] = {6, 4, 5, 2};
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < lengths[i]; ++j) mask[size_t(i * t + j)] = 1.0;
  const Array m = Array::from_vector(mask, {n, t});
  const Array ref = add(logps, random_uniform({n, t}, 32, -0.5, 0.5));
  const Array adv = Array::from_vector(std::vector<double>{1.2, -0.4, 0.7, -1.5}, {n});
  for (int64_t iterations : {2, 1}) {
    SCOPED_TRACE(iterations);
    // Two iterations: the sampling policy apart by up to ±0.4 nats, so some ratios clip.
    const Array old = iterations > 1 ? add(logps, random_uniform({n, t}, 33, -0.4, 0.4)) : logps;
    posttrain::GrpoOptions o;
    o.beta = 0.04, o.epsilon = 0.2, o.num_iterations = iterations;
    const json ref_out = trl("grpo", {{"per_token_logps", rows_of(logps)}, {"old_per_token_logps", rows_of(old)},
                                      {"ref_per_token_logps", rows_of(ref)}, {"advantages", adv.to_doubles()},
                                      {"completion_mask", rows_of(m)}, {"beta", o.beta}, {"epsilon", o.epsilon},
                                      {"num_iterations", iterations}});
    Params p;
    p.set("logps", logps);
    train::MetricRecorder recorder;
    auto [loss, grads] =
        value_and_grad([&](const Params& q) { return posttrain::grpo_loss(q["logps"], iterations > 1 ? old : q["logps"], ref, adv, m, o); })(p);
    const auto metrics = recorder.take();
    const double err = std::abs(loss.item() - ref_out["loss"].get<double>());
    const std::vector<std::vector<double>> g = ref_out["grad"];
    const std::vector<double> ours = grads["logps"].to_doubles();
    double grad_err = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < t; ++j) grad_err = std::max(grad_err, std::abs(ours[size_t(i * t + j)] - g[size_t(i)][size_t(j)]));
    std::cout << "iterations " << iterations << ": loss " << loss.item() << " vs TRL " << ref_out["loss"] << " (|err| " << err
              << "), gradient |err| " << grad_err << ", kl " << metrics.at("kl").item() << " vs " << ref_out["kl"]
              << ", clip_ratio " << metrics.at("clip_ratio").item() << " vs " << ref_out["clip_ratio"] << "\n";
    EXPECT_LT(err, 1e-6);
    EXPECT_LT(grad_err, 1e-7);
    EXPECT_NEAR(metrics.at("kl").item(), ref_out["kl"].get<double>(), 1e-6);
    EXPECT_NEAR(metrics.at("clip_ratio").item(), ref_out["clip_ratio"].get<double>(), 1e-7);
    if (iterations > 1) EXPECT_GT(ref_out["clip_ratio"].get<double>(), 0.0);  // the case exercises clipping
  }
}

TEST(GrpoOracle, OneIterationGradientIsTheAdvantageWeightedLikelihoodGradient) {
  // β = 0, ratio 1: ∂L/∂logp_it = −A_i / (completion tokens of the batch).
  const Array logps = random_uniform({2, 3}, 41, -2.0, -0.1);
  const Array m = Array::from_vector(std::vector<double>{1, 1, 0, 1, 1, 1}, {2, 3});
  const Array adv = Array::from_vector(std::vector<double>{0.5, -2.0}, {2});
  posttrain::GrpoOptions o;
  o.beta = 0;
  Params p;
  p.set("logps", logps);
  auto [loss, grads] = value_and_grad([&](const Params& q) { return posttrain::grpo_loss(q["logps"], q["logps"], Array(), adv, m, o); })(p);
  EXPECT_NEAR(loss.item(), -(0.5 * 2 - 2.0 * 3) / 5.0, 1e-6);  // −Σ A over tokens / 5
  const std::vector<double> g = grads["logps"].to_doubles();
  const std::vector<double> want{-0.1, -0.1, 0, 0.4, 0.4, 0.4};
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], 1e-7) << i;
}

TEST(GrpoOracle, GroupAdvantagesNormaliseWithinEachGroup) {
  std::vector<double> sd;
  const std::vector<double> a = posttrain::group_advantages({1, 0, 0, 1, 2, 2, 2, 2}, 4, &sd);
  // Group 1: mean 0.5, unbiased std sqrt(1/3); group 2: all equal, advantage 0.
  const double s1 = std::sqrt(1.0 / 3.0);
  EXPECT_NEAR(sd[0], s1, 1e-12);
  EXPECT_NEAR(a[0], 0.5 / (s1 + 1e-4), 1e-12);
  EXPECT_NEAR(a[1], -0.5 / (s1 + 1e-4), 1e-12);
  EXPECT_EQ(a[5], 0.0);
  EXPECT_EQ(error_of([] { posttrain::group_advantages({1, 2, 3}, 2); }), "[grpo] 3 rewards do not form groups of 2");
}

}  // namespace
}  // namespace mt::testing
