// LoRA against PyTorch and against its own promises: GPT-2 (Conv1D, fused c_attn), LLaMA and
// BERT with adapters match a twin that adds s·B A to each adapted weight (logits and the
// gradients of W, A and B; f32 tight, bf16 matmuls per-dtype); fresh adapters (B = 0) leave
// the logits bit for bit; merged logits equal unmerged; the adapters of a LoRA GPT-2 need
// <= 2 % of full fine-tuning's optimizer state; PEFT directories have PEFT's keys, shapes and
// config fields and round-trip; bad targets, ranks and foreign adapters are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "meshtrain/io/json.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/models/bert.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/llama.h"
#include "meshtrain/models/lora.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/optim/partition.h"
#include "tests/support/model_twins.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

using namespace mt::models;
namespace fs = std::filesystem;
using json = nlohmann::json;

// Random weights for base and adapters alike (B != 0, so the adapter path carries signal
// in both directions).
Params randomize(const std::vector<ParamDef>& defs, uint64_t seed, double scale = 0.3) {
  return random_model_params(defs, seed, scale);
}

std::vector<ParamDef> with_adapters(std::vector<ParamDef> base, const LoraOptions& o, const std::string& targets) {
  for (ParamDef& d : lora_param_defs(base, o, targets)) base.push_back(d);
  return base;
}

LoraOptions lora(int64_t rank, double alpha, const std::string& targets = "", double dropout = 0,
                 bool rslora = false) {
  LoraOptions o;
  o.rank = rank, o.alpha = alpha, o.targets = targets, o.dropout = dropout, o.use_rslora = rslora;
  return o;
}

PretrainedOptions seeded(uint64_t seed) {
  PretrainedOptions o;
  o.init_key = RngKey{seed, 0};
  return o;
}

std::string py(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}

Gpt2Config small_gpt2() {
  Gpt2Config c;
  c.vocab_size = 37, c.n_positions = 16, c.n_embd = 12, c.n_layer = 2, c.n_head = 3;
  c.embd_pdrop = c.attn_pdrop = c.resid_pdrop = 0;
  return c;
}

TEST(LoraOracle, Gpt2FusedAttentionAndConv1dMatchTwin) {
  Gpt2Config c = small_gpt2();
  c.lora = lora(4, 8.0);
  const std::vector<ParamDef> defs = with_adapters(gpt2_param_defs(c), c.lora, gpt2_model_spec().lora_targets);
  Params p = randomize(defs, 300);
  ASSERT_TRUE(p.contains("transformer.h.0.attn.c_attn.lora_B.weight"));
  EXPECT_EQ(p["transformer.h.0.attn.c_attn.lora_B.weight"].shape(), Shape({3, 12, 4}));
  EXPECT_EQ(p["transformer.h.1.mlp.c_fc.lora_A.weight"].shape(), Shape({4, 12}));
  EXPECT_EQ(p["transformer.h.1.mlp.c_fc.lora_B.weight"].shape(), Shape({48, 4}));
  Array ids = random_ints({2, 7}, 5, 0, c.vocab_size);
  Array mask = Array::from_vector(std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, Shape{2, 7});
  const std::string call = "gpt2_twin(lora_weights(P, " + py(c.lora.scale()) + ", True), X[0], X[1], 2, 3, 1e-5)";
  check_twin("gpt2 lora r4", p, {ids, mask},
             [&](const Params& q) { return gpt2_apply(c, q, {.input_ids = ids, .attention_mask = mask}); }, call);
}

TEST(LoraOracle, LlamaRsLoraAllProjectionsMatchTwin) {
  LlamaConfig c;
  c.vocab_size = 33, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.rms_norm_eps = 1e-5, c.rope_theta = 500.0;
  c.lora = lora(3, 5.0, "", 0, true);
  const std::vector<ParamDef> defs = with_adapters(llama_param_defs(c), c.lora, llama_model_spec().lora_targets);
  EXPECT_EQ(defs.size(), llama_param_defs(c).size() + 2 * 7 * 2);  // q k v o gate up down per layer
  Params p = randomize(defs, 700, 0.1);
  Array ids = random_ints({2, 6}, 9, 0, c.vocab_size);
  EXPECT_NEAR(c.lora.scale(), 5.0 / std::sqrt(3.0), 1e-15);
  const std::string call =
      "llama_twin(lora_weights(P, " + py(c.lora.scale()) + ", False), X[0], None, 2, 4, 2, 1e-5, 500.0, False)";
  check_twin("llama rslora r3", p, {ids}, [&](const Params& q) { return llama_apply(c, q, {.input_ids = ids}); }, call);
  // bf16 matmuls (8-bit mantissas in every GEMM, f32 accumulation): the f32 twin within the
  // bf16 tolerance, which scales with each tensor's largest magnitude.
  MatmulPrecisionScope bf16(MatmulPrecision::bf16);
  check_twin("llama rslora r3 bf16 matmuls", p, {ids},
             [&](const Params& q) { return llama_apply(c, q, {.input_ids = ids}); }, call,
             default_tolerance(DType::bf16), {2e-2, 2e-2, 3e-2});
}

TEST(LoraOracle, BertEncoderTargetsMatchTwin) {
  BertConfig c;
  c.vocab_size = 40, c.hidden_size = 12, c.num_hidden_layers = 2, c.num_attention_heads = 3;
  c.intermediate_size = 20, c.max_position_embeddings = 16, c.num_labels = 3;
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
  c = c.with_head(BertHead::sequence_classification);
  c.lora = lora(2, 4.0, R"(attention\.self\.(query|value)$)");
  const std::vector<ParamDef> defs = with_adapters(bert_param_defs(c), c.lora, bert_model_spec().lora_targets);
  EXPECT_EQ(defs.size(), bert_param_defs(c).size() + 2 * 2 * 2);
  Params p = randomize(defs, 900);
  Array ids = random_ints({2, 5}, 3, 1, c.vocab_size);
  Array tt = Array::zeros(Shape{2, 5}, DType::i64);
  Array mask = Array::ones(Shape{2, 5}, DType::i64);
  const std::string call = "bert_twin(lora_weights(P, 2.0, False), X[0], X[1], X[2], 2, 3, 1e-12, 'cls')";
  check_twin("bert lora q/v", p, {ids, mask, tt},
             [&](const Params& q) {
               return bert_apply(c, q, {.input_ids = ids, .attention_mask = mask, .token_type_ids = tt}).logits;
             },
             call);
}

nlohmann::json tiny_gpt2_json(int64_t width = 16, int64_t layers = 2, int64_t vocab = 50) {
  return {{"model_type", "gpt2"}, {"vocab_size", vocab}, {"n_positions", 16}, {"n_embd", width},
          {"n_layer", layers},    {"n_head", 4},         {"embd_pdrop", 0.0},  {"attn_pdrop", 0.0},
          {"resid_pdrop", 0.0}};
}

Array logits_of(const PretrainedModel& m, const Array& ids) {
  return m.decoder_logits(m.params, {.input_ids = ids}, RngKey{0, 0}, false);
}

TEST(LoraOracle, FreshAdaptersLeaveLogitsBitForBitAndMergeMatches) {
  PretrainedModel base = init_model(tiny_gpt2_json(), seeded(1));
  Array ids = random_ints({2, 8}, 4, 0, 50);
  const Array ref = logits_of(base, ids);
  PretrainedModel m = base;
  add_lora(m, lora(4, 16.0), RngKey{2, 0});
  EXPECT_EQ(m.params.size(), base.params.size() + 4 * 2 * 2);
  double bits = max_abs_diff(logits_of(m, ids), ref);
  std::cout << "  fresh adapters (B = 0) vs base: max |diff| " << bits << "\n";
  EXPECT_EQ(bits, 0.0);
  // A is Kaiming-uniform: within ±1/sqrt(in) and not zero.
  auto a = m.params["transformer.h.0.attn.c_attn.lora_A.weight"].to_doubles();
  double amax = 0;
  for (double v : a) amax = std::max(amax, std::abs(v));
  EXPECT_GT(amax, 0.5 / 4.0);
  EXPECT_LE(amax, 1.0 / 4.0);

  // Give B values, then merged == unmerged.
  for (auto& [path, v] : m.params)
    if (path.find("lora_B") != std::string::npos) v = random_normal(v.shape(), 77, DType::f32, 0.2);
  const Array adapted = logits_of(m, ids);
  EXPECT_GT(max_abs_diff(adapted, ref), 1e-3);
  PretrainedModel merged = merge_lora(m);
  EXPECT_FALSE(merged.config.lora().enabled());
  EXPECT_EQ(merged.params.size(), base.params.size());
  double merge_err = max_abs_diff(logits_of(merged, ids), adapted);
  std::cout << "  merged vs unmerged logits: max |diff| " << merge_err << "\n";
  EXPECT_LE(merge_err, 1e-5);
  // Unmerging restores the base weights.
  Params with = merged.params;
  for (const auto& [path, v] : m.params)
    if (is_lora_path(path)) with.set(path, v);
  Params back = unmerge_lora(with, base.param_defs(), m.config.lora());
  double unmerge_err = 0;
  for (const auto& [path, w] : base.params) unmerge_err = std::max(unmerge_err, max_abs_diff(back[path], w));
  std::cout << "  unmerge(merge(W)) vs W: max |diff| " << unmerge_err << "\n";
  EXPECT_LE(unmerge_err, 1e-6);
}

// The Trainer differentiates only the trainable parameters (the frozen base enters as
// constants): the adapters' gradients must be those of differentiating everything.
TEST(LoraOracle, GradientsWithAFrozenBaseEqualFullGradients) {
  for (const char* type : {"gpt2", "llama"}) {
    nlohmann::json config = std::string(type) == "gpt2"
                                ? tiny_gpt2_json()
                                : nlohmann::json{{"model_type", "llama"}, {"vocab_size", 50}, {"hidden_size", 16},
                                                 {"intermediate_size", 32}, {"num_hidden_layers", 2},
                                                 {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
    PretrainedModel m = init_model(config, seeded(1));
    add_lora(m, lora(4, 8.0), RngKey{2, 0});
    for (auto& [path, v] : m.params)
      if (path.find("lora_B") != std::string::npos) v = random_normal(v.shape(), 5, DType::f32, 0.1);
    Array ids = random_ints({2, 8}, 4, 0, 50), labels = random_ints({2, 8}, 6, 0, 50);
    auto loss_of = [&](const Params& p) { return cross_entropy(m.decoder_logits(p, {.input_ids = ids}, RngKey{0, 0}, true), labels); };
    auto [l_all, g_all] = value_and_grad(loss_of)(m.params);
    optim::Transform opt = optim::partition({{lora_parameter_pattern(), optim::sgd(optim::constant_schedule(0.1))},
                                             {".*", optim::freeze()}});
    auto [trainable, frozen] = optim::split_frozen(opt, m.params);
    auto [l_split, g_split] = value_and_grad([&](const Params& t) {
      Params all = frozen;
      for (const auto& [path, v] : t) all.set(path, v);
      return loss_of(all);
    })(trainable);
    double err = std::abs(l_all.item() - l_split.item());
    for (const auto& [path, g] : g_split) err = std::max(err, max_abs_diff(g, g_all[path]));
    std::cout << "  " << type << ": adapter gradients with the base frozen vs all leaves: max |diff| " << err << " over "
              << g_split.size() << " adapters\n";
    EXPECT_EQ(g_split.size(), trainable.size());
    EXPECT_LE(err, 1e-6);
  }
}

TEST(LoraOracle, OptimizerStateIsUnderTwoPercentOfFullFineTuning) {
  // GPT-2's own width (768), two layers, rank 8 on c_attn, c_proj, c_fc and the MLP's c_proj.
  PretrainedModel m = init_model(tiny_gpt2_json(768, 2, 1024), seeded(1));
  auto bytes = [](const Params& state) {
    int64_t n = 0;
    for (const auto& [path, v] : state) n += v.numel() * int64_t(dtype_size(v.dtype()));
    return n;
  };
  const int64_t full = bytes(optim::adamw(optim::constant_schedule(1e-3)).init(m.params));
  add_lora(m, lora(8, 16.0), RngKey{2, 0});
  optim::Transform opt = optim::chain(
      {optim::clip_by_global_norm(1.0),
       optim::partition({{lora_parameter_pattern(), optim::adamw(optim::constant_schedule(1e-3))},
                         {".*", optim::freeze()}})});
  const int64_t lora = bytes(opt.init(m.params));
  const double share = double(lora) / double(full);
  std::cout << "  AdamW state: full fine-tuning " << full << " bytes, LoRA r8 " << lora << " bytes (" << 100 * share
            << " %)\n";
  EXPECT_LE(share, 0.02);
  EXPECT_GT(lora, 0);
  // Frozen: every base parameter; trainable: exactly the adapters.
  auto [trainable, frozen] = optim::split_frozen(opt, m.params);
  for (const auto& [path, v] : trainable) EXPECT_TRUE(is_lora_path(path)) << path;
  EXPECT_EQ(trainable.size(), size_t(2 * 4 * 2));
  EXPECT_EQ(frozen.size() + trainable.size(), m.params.size());
}

class LoraFiles : public TempDir {};

TEST_F(LoraFiles, PeftDirectoryHasPeftLayoutAndRoundTrips) {
  PretrainedModel m = init_model(tiny_gpt2_json(), seeded(1));
  add_lora(m, lora(4, 8.0, "", 0.05), RngKey{3, 0});
  for (auto& [path, v] : m.params)
    if (path.find("lora_B") != std::string::npos) v = random_normal(v.shape(), 11, DType::f32, 0.1);
  const std::string out = (dir_ / "adapter").string();
  save_adapter(m, out, "my/base-gpt2");

  // The layout PEFT documents, written out here: keys "base_model.model.<module>.lora_A.weight"
  // [r, in] and lora_B.weight [out, r] (c_attn's out is 3·n_embd), config fields as PEFT's
  // LoraConfig names them.
  io::SafetensorsFile f = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
  std::map<std::string, Shape> want;
  for (int l = 0; l < 2; ++l) {
    const std::string b = "base_model.model.transformer.h." + std::to_string(l) + ".";
    want[b + "attn.c_attn.lora_A.weight"] = Shape{4, 16};
    want[b + "attn.c_attn.lora_B.weight"] = Shape{48, 4};
    want[b + "attn.c_proj.lora_A.weight"] = Shape{4, 16};
    want[b + "attn.c_proj.lora_B.weight"] = Shape{16, 4};
    want[b + "mlp.c_fc.lora_A.weight"] = Shape{4, 16};
    want[b + "mlp.c_fc.lora_B.weight"] = Shape{64, 4};
    want[b + "mlp.c_proj.lora_A.weight"] = Shape{4, 64};
    want[b + "mlp.c_proj.lora_B.weight"] = Shape{16, 4};
  }
  EXPECT_EQ(f.keys().size(), want.size());
  for (const auto& [key, shape] : want) {
    ASSERT_TRUE(f.contains(key)) << key;
    EXPECT_EQ(f.info(key).shape, shape) << key;
    EXPECT_EQ(f.info(key).file_dtype, "F32") << key;
  }
  const json c = io::read_json_file(out + "/adapter_config.json");
  EXPECT_EQ(c["peft_type"], "LORA");
  EXPECT_EQ(c["task_type"], "CAUSAL_LM");
  EXPECT_EQ(c["r"], 4);
  EXPECT_EQ(c["lora_alpha"], 8.0);
  EXPECT_EQ(c["lora_dropout"], 0.05);
  EXPECT_EQ(c["base_model_name_or_path"], "my/base-gpt2");
  EXPECT_EQ(c["fan_in_fan_out"], true);
  EXPECT_EQ(c["use_rslora"], false);
  EXPECT_EQ(c["bias"], "none");
  EXPECT_EQ(c["target_modules"], json({"c_attn", "c_fc", "c_proj"}));

  // Round trip onto a fresh copy of the base.
  PretrainedModel base = init_model(tiny_gpt2_json(), seeded(1));
  PretrainedModel loaded = base;
  load_adapter(loaded, out);
  EXPECT_EQ(loaded.config.lora().rank, 4);
  EXPECT_EQ(loaded.config.lora().alpha, 8.0);
  EXPECT_EQ(loaded.params.size(), m.params.size());
  for (const auto& [path, v] : m.params) EXPECT_EQ(max_abs_diff(loaded.params[path], v), 0.0) << path;
  Array ids = random_ints({1, 6}, 8, 0, 50);
  EXPECT_EQ(max_abs_diff(logits_of(loaded, ids), logits_of(m, ids)), 0.0);

  // A regex target that no list of names reproduces is written as a regex PEFT full-matches.
  PretrainedModel one = init_model(tiny_gpt2_json(), seeded(1));
  add_lora(one, lora(2, 4.0, R"(h\.1\.attn\.c_proj$)"), RngKey{3, 0});
  save_adapter(one, (dir_ / "one").string(), "base");
  const json c1 = io::read_json_file((dir_ / "one/adapter_config.json").string());
  EXPECT_EQ(c1["target_modules"], json({"1.attn.c_proj"}));
  PretrainedModel one_back = init_model(tiny_gpt2_json(), seeded(1));
  load_adapter(one_back, (dir_ / "one").string());
  EXPECT_EQ(one_back.params.size(), base.params.size() + 2);
}

TEST_F(LoraFiles, BadTargetsRanksAndForeignAdaptersAreClearErrors) {
  PretrainedModel m = init_model(tiny_gpt2_json(), seeded(1));
  auto error_of = [&](LoraOptions o) {
    PretrainedModel copy = m;
    try {
      add_lora(copy, o, RngKey{0, 0});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string e = error_of(lora(4, 8.0, "q_proj"));
  EXPECT_NE(e.find("matches no dense layer"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer.h.0.attn.c_attn"), std::string::npos) << e;
  e = error_of(lora(0, 8.0));
  EXPECT_NE(e.find("rank must be > 0"), std::string::npos) << e;
  e = error_of(lora(17, 8.0));
  EXPECT_NE(e.find("rank 17 exceeds"), std::string::npos) << e;
  e = error_of(lora(4, 8.0, "(unclosed"));
  EXPECT_NE(e.find("invalid target regex"), std::string::npos) << e;

  // An adapter written for a LLaMA does not load onto a GPT-2, nor one for another width.
  PretrainedModel llama = init_model({{"model_type", "llama"}, {"vocab_size", 50}, {"hidden_size", 16},
                                      {"intermediate_size", 32}, {"num_hidden_layers", 2},
                                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}},
                                     seeded(1));
  add_lora(llama, lora(2, 8.0), RngKey{0, 0});
  save_adapter(llama, (dir_ / "llama").string(), "tiny-llama");
  PretrainedModel target = m;
  try {
    load_adapter(target, (dir_ / "llama").string());
    ADD_FAILURE() << "a LLaMA adapter loaded onto GPT-2";
  } catch (const Error& err) {
    std::string s = err.what();
    std::cout << "  " << s << "\n";
    EXPECT_NE(s.find("tiny-llama"), std::string::npos) << s;
    EXPECT_NE(s.find("does not fit"), std::string::npos) << s;
  }
  EXPECT_FALSE(target.config.lora().enabled());
  PretrainedModel wide = init_model(tiny_gpt2_json(32), seeded(1));
  add_lora(wide, lora(2, 8.0), RngKey{0, 0});
  save_adapter(wide, (dir_ / "wide").string(), "wide-gpt2");
  target = m;
  try {
    load_adapter(target, (dir_ / "wide").string());
    ADD_FAILURE() << "a 32-wide adapter loaded onto a 16-wide GPT-2";
  } catch (const Error& err) {
    std::string s = err.what();
    std::cout << "  " << s << "\n";
    EXPECT_NE(s.find("has shape (2, 32)"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace mt::testing
