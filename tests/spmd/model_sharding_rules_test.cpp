// The automatic sharding rules on the real model trees — BERT with a classification head,
// GPT-2 (Conv1D [in, out] weights, tied head), LLaMA (grouped-query attention, SwiGLU,
// untied lm_head) and miniGPT: every path gets the Megatron layout its declared role calls
// for, and three AdamW steps under the automatic plan on data x model equal the one-device
// run. (sharding_rules_test.cpp covers options, overrides and errors on the tiny GPT.)
#include <gtest/gtest.h>

#include <functional>
#include <iostream>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/bert.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/vision_encoder_decoder.h"
#include "meshtrain/models/llama.h"
#include "meshtrain/models/minigpt.h"
#include "meshtrain/train/sharding_rules.h"
#include "tests/support/op_check.h"
#include "tests/support/tiny_gpt.h"

namespace mt::testing {
namespace {

using dist::Mesh;
using dist::PartitionSpec;
using models::ParamKind;
using models::ParamRole;

constexpr int64_t kBatch = 4, kTime = 8, kVocab = 100;  // vocab even: rows split over model=2

// One model under test: its tree, roles, loss over a batch (arrays with the batch first,
// sharded over "data" or not) and hand-written layouts for a model axis of size 2.
struct ModelCase {
  std::string name;
  Params params;
  models::ParamRoles roles;
  std::vector<Array> batch;
  std::function<Array(const Params&, const std::vector<Array>&, uint64_t step)> loss;
  std::vector<std::pair<std::string, PartitionSpec>> expected_on_model2;
  int split_count = 0;  // parameters split over "model" (so the per-path loop cannot pass vacuously)
  // Forward pass to the last hidden states (or logits), for counting collectives.
  std::function<Array(const Params&, const Array& ids)> forward;
  // All-reduces over "model" that forward costs when every column/row pair lines up (one for
  // the vocab-parallel embeddings, one per pair); -1 where the model is known to cost more.
  int paired_forward_all_reduces = -1;
};

const PartitionSpec kRows{"model", ""}, kCols{"", "model"}, kNone{};

RngKey dropout_key(uint64_t step) { return RngKey{9, step}; }

ModelCase bert_case() {
  models::BertConfig c;
  c.vocab_size = kVocab, c.hidden_size = 32, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.intermediate_size = 64, c.max_position_embeddings = 16, c.num_labels = 3;
  c = c.with_head(models::BertHead::sequence_classification);  // pooler + classifier
  Array mask = Array::ones({kBatch, kTime}, DType::i64).clone();
  for (int64_t i : {int64_t(1 * kTime + 6), int64_t(1 * kTime + 7), int64_t(3 * kTime + 7)}) mask.data<int64_t>()[i] = 0;
  ModelCase m{"bert", models::bert_init(c, RngKey{1, 0}), models::bert_param_roles(c),
              {random_ints({kBatch, kTime}, 10, 1, kVocab), mask, random_ints({kBatch, kTime}, 11, 0, 2),
               random_ints({kBatch}, 12, 0, c.num_labels)},
              nullptr, {}, 0, nullptr, -1};
  m.loss = [c](const Params& p, const std::vector<Array>& b, uint64_t step) {
    models::BertInputs in{.input_ids = b[0], .attention_mask = b[1], .token_type_ids = b[2]};
    return cross_entropy(models::bert_apply(c, p, in, dropout_key(step), true).logits, b[3]);
  };
  const std::string l0 = "bert.encoder.layer.0.", l1 = "bert.encoder.layer.1.";
  // nn.Linear [out, in]: column-parallel splits dim 0, row-parallel dim 1.
  m.expected_on_model2 = {{"bert.embeddings.word_embeddings.weight", kRows},
                          {"bert.embeddings.token_type_embeddings.weight", kRows},
                          {"bert.embeddings.LayerNorm.weight", kNone},
                          {l0 + "attention.self.query.weight", kRows},
                          {l0 + "attention.self.value.weight", kRows},
                          {l0 + "attention.self.query.bias", kNone},
                          {l0 + "attention.output.dense.weight", kCols},
                          {l0 + "attention.output.dense.bias", kNone},
                          {l1 + "intermediate.dense.weight", kRows},
                          {l1 + "output.dense.weight", kCols},
                          {l1 + "output.LayerNorm.bias", kNone},
                          // The two "dense" matrices alternate in tree order: pooler column, classifier row.
                          {"bert.pooler.dense.weight", kRows},
                          {"classifier.weight", kCols},
                          {"classifier.bias", kNone}};
  m.split_count = 3 + 2 * 6 + 2;  // 3 embeddings, q/k/v/out/in/out per layer, pooler, classifier
  m.forward = [c](const Params& p, const Array& ids) { return models::bert_encoder(c, p, {.input_ids = ids}); };
  m.paired_forward_all_reduces = 1 + 2 * 2;
  return m;
}

ModelCase gpt2_case() {
  models::Gpt2Config c;
  c.vocab_size = kVocab, c.n_positions = 16, c.n_embd = 32, c.n_layer = 2, c.n_head = 4;
  ModelCase m{"gpt2", models::gpt2_init(c, RngKey{2, 0}), models::gpt2_param_roles(c),
              {random_ints({kBatch, kTime}, 20, 0, kVocab), random_ints({kBatch, kTime}, 21, 0, kVocab)}, nullptr, {}, 0, nullptr, -1};
  m.loss = [c](const Params& p, const std::vector<Array>& b, uint64_t step) {
    return cross_entropy(models::gpt2_apply(c, p, {.input_ids = b[0]}, dropout_key(step), true), b[1]);
  };
  const std::string h0 = "transformer.h.0.", h1 = "transformer.h.1.";
  // Conv1D [in, out]: column-parallel splits dim 1, row-parallel dim 0 — the opposite of Linear.
  m.expected_on_model2 = {{"transformer.wte.weight", kRows},  // also the tied head: vocab-parallel logits
                          {"transformer.wpe.weight", kRows},
                          {h0 + "ln_1.weight", kNone},
                          {h0 + "attn.c_attn.weight", PartitionSpec{"", "", "model"}},  // [in, 3, out]
                          {h0 + "attn.c_attn.bias", kNone},
                          {h0 + "attn.c_proj.weight", kRows},
                          {h1 + "mlp.c_fc.weight", kCols},
                          {h1 + "mlp.c_proj.weight", kRows},
                          {h1 + "mlp.c_proj.bias", kNone},
                          {"transformer.ln_f.bias", kNone}};
  m.split_count = 2 + 2 * 4;
  // c_attn is kept as [in, 3, out] and split within q, k and v: each rank holds whole heads,
  // so attention is head-parallel with no gathers.
  m.forward = [c](const Params& p, const Array& ids) { return models::gpt2_hidden(c, p, {.input_ids = ids}); };
  m.paired_forward_all_reduces = 2 + 2 * 2;  // token and position embeddings are both vocab/row-parallel
  return m;
}

ModelCase llama_case() {
  models::LlamaConfig c;
  c.vocab_size = kVocab, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2;  // GQA: 2 query heads per key/value head
  ModelCase m{"llama", models::llama_init(c, RngKey{3, 0}), models::llama_param_roles(c),
              {random_ints({kBatch, kTime}, 30, 0, kVocab), random_ints({kBatch, kTime}, 31, 0, kVocab)}, nullptr, {}, 0, nullptr, -1};
  m.loss = [c](const Params& p, const std::vector<Array>& b, uint64_t step) {
    return cross_entropy(models::llama_apply(c, p, {.input_ids = b[0]}, dropout_key(step), true), b[1]);
  };
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  m.expected_on_model2 = {{"model.embed_tokens.weight", kRows},
                          {l0 + "input_layernorm.weight", kNone},
                          {l0 + "self_attn.q_proj.weight", kRows},
                          {l0 + "self_attn.k_proj.weight", kRows},  // (16, 32): one whole kv head per rank
                          {l0 + "self_attn.v_proj.weight", kRows},
                          {l0 + "self_attn.o_proj.weight", kCols},
                          {l1 + "mlp.gate_proj.weight", kRows},
                          {l1 + "mlp.up_proj.weight", kRows},
                          {l1 + "mlp.down_proj.weight", kCols},
                          {"model.norm.weight", kNone},
                          {"lm_head.weight", kRows}};  // vocab-parallel logits
  m.split_count = 1 + 2 * 7 + 1;
  m.forward = [c](const Params& p, const Array& ids) { return models::llama_hidden(c, p, {.input_ids = ids}); };
  m.paired_forward_all_reduces = 1 + 2 * 2;
  return m;
}

ModelCase minigpt_case() {
  models::MiniGptConfig c;
  c.vocab_size = kVocab, c.maxlen = 16, c.embed_dim = 32, c.num_heads = 4, c.feed_forward_dim = 64;
  c.num_transformer_blocks = 2;
  ModelCase m{"minigpt", models::minigpt_init(c, RngKey{4, 0}), models::minigpt_param_roles(c),
              {random_ints({kBatch, kTime}, 40, 0, kVocab), random_ints({kBatch, kTime}, 41, 0, kVocab)}, nullptr, {}, 0, nullptr, -1};
  m.loss = [c](const Params& p, const std::vector<Array>& b, uint64_t step) {
    return cross_entropy(models::minigpt_apply(c, p, {.input_ids = b[0]}, dropout_key(step), true), b[1]);
  };
  m.expected_on_model2 = {{"embedding.token_emb.weight", kRows},
                          {"embedding.pos_emb.weight", kRows},
                          {"blocks.0.attn.key.weight", kRows},
                          {"blocks.0.attn.key.bias", kNone},
                          {"blocks.0.attn.out.weight", kCols},
                          {"blocks.1.ffn.linear1.weight", kRows},
                          {"blocks.1.ffn.linear2.weight", kCols},
                          {"blocks.1.ln2.weight", kNone},
                          {"output_layer.weight", kRows}};
  m.split_count = 2 + 2 * 6 + 1;
  // Post-LN: the first block's q/k/v read the embeddings' partial sum directly, and each
  // all-reduces it on its own (the engine does not share one reduction between consumers).
  m.forward = [c](const Params& p, const Array& ids) { return models::minigpt_apply(c, p, {.input_ids = ids}); };
  return m;
}

// ViT-GPT2: a ViT encoder 16 wide projected to a GPT-2 decoder of 32 with cross-attention.
ModelCase vision_encoder_decoder_case() {
  models::VisionEncoderDecoderConfig c;
  c.encoder.hidden_size = 16, c.encoder.num_hidden_layers = 2, c.encoder.num_attention_heads = 2;
  c.encoder.intermediate_size = 32, c.encoder.image_size = 12, c.encoder.patch_size = 4;
  c.encoder.add_pooling_layer = false;
  c.decoder.vocab_size = kVocab, c.decoder.n_positions = 16, c.decoder.n_embd = 32, c.decoder.n_layer = 2;
  c.decoder.n_head = 4, c.decoder.add_cross_attention = true;
  c.decoder_start_token_id = c.pad_token_id = c.eos_token_id = 0;
  const std::vector<models::ParamDef> defs = models::vision_encoder_decoder_param_defs(c);
  ModelCase m{"vit-gpt2", models::init_params(defs, RngKey{5, 0}), models::roles_of(defs),
              {random_normal({kBatch, 3, 12, 12}, 50), random_ints({kBatch, kTime}, 51, 0, kVocab),
               random_ints({kBatch, kTime}, 52, 0, kVocab)},
              nullptr, {}, 0, nullptr, -1};
  m.loss = [c](const Params& p, const std::vector<Array>& b, uint64_t step) {
    return cross_entropy(models::vision_encoder_decoder_logits(c, p, b[0], b[1], Array(), dropout_key(step), true), b[2]);
  };
  const std::string e0 = "encoder.encoder.layer.0.", d0 = "decoder.transformer.h.0.";
  m.expected_on_model2 = {{"encoder.embeddings.cls_token", PartitionSpec{"", "", ""}},
                          {"encoder.embeddings.patch_embeddings.projection.weight", kCols},
                          {e0 + "attention.attention.query.weight", kRows},
                          {e0 + "attention.output.dense.weight", kCols},
                          {"enc_to_dec_proj.weight", kRows},  // the first undeclared dense: column
                          {d0 + "crossattention.c_attn.weight", PartitionSpec{"", "", "model"}},  // [in, 2, out]
                          {d0 + "crossattention.q_attn.weight", kCols},
                          {d0 + "crossattention.c_proj.weight", kRows}};
  // patch projection, 6 per encoder layer, the projection, 2 embeddings, 7 per decoder layer
  m.split_count = 1 + 2 * 6 + 1 + 2 + 2 * 7;
  // The row-parallel patch projection and each layer's attention and MLP (the projection to
  // the decoder's width returns a partial sum its consumer reduces): the residual stream stays
  // whole, never gathered before a norm (it was split on features, 5 all-gathers more).
  m.paired_forward_all_reduces = 1 + 2 * 2;
  m.forward = [c](const Params& p, const Array& pixels) { return models::vision_encode(c, p, pixels); };
  return m;
}

std::vector<ModelCase> all_cases() {
  return {bert_case(), gpt2_case(), llama_case(), minigpt_case(), vision_encoder_decoder_case()};
}

// 4 ranks: data=2,model=2; otherwise data only (one process: a plain run).
Mesh test_mesh() {
  const int n = dist::world().size();
  return n == 4 ? Mesh::from_string("data=2,model=2") : Mesh::from_string("data=" + std::to_string(n));
}

// The layout a role promises (sharding_rules.h), written out independently of the rules:
// which dim carries "model" (-1: replicated). `dense_out` tracks the alternation of
// undeclared dense matrices in parameter order.
int expected_model_dim(const ParamRole& r, const Shape& s, int64_t n, bool& dense_out) {
  if (n <= 1 || s.ndim() < 2 || r.kind == ParamKind::bias || r.kind == ParamKind::norm) return -1;
  int d = -1;
  switch (r.kind) {
    case ParamKind::embedding: d = s[r.in_dim] % n == 0 ? r.in_dim : r.out_dim; break;  // vocab rows first
    case ParamKind::attention_qkv:
    case ParamKind::mlp_in:
    case ParamKind::lm_head: d = r.out_dim; break;  // column-parallel
    case ParamKind::attention_out:
    case ParamKind::mlp_out:
    case ParamKind::input_projection: d = r.in_dim; break;  // row-parallel
    default:
      d = dense_out ? r.out_dim : r.in_dim;
      dense_out = !dense_out;
  }
  return d >= 0 && s[d] % n == 0 ? d : -1;
}

TEST(ModelShardingRules, EveryPathGetsItsRolesLayout) {
  Mesh mesh = test_mesh();
  const int64_t model = mesh.has_axis("model") ? mesh.axis_size("model") : 1;
  for (const ModelCase& m : all_cases()) {
    SCOPED_TRACE(m.name);
    train::ShardingPlan plan = train::auto_sharding_rules(m.params, mesh, m.roles);
    if (dist::world().rank() == 0) std::cout << "  " << m.name << " on " << mesh.str() << ":\n" << plan.table();
    ASSERT_EQ(plan.entries().size(), m.params.size());
    // Every declared path is a parameter and every parameter has a declared role.
    EXPECT_EQ(m.roles.size(), m.params.size());
    bool dense_out = true;
    int split = 0;
    for (const auto& [path, value] : m.params) {
      ASSERT_TRUE(m.roles.count(path)) << path;
      const ParamRole& role = m.roles.at(path);
      PartitionSpec want;
      want.dims.assign(size_t(value.ndim()), {});
      int d = expected_model_dim(role, value.shape(), model, dense_out);
      if (d >= 0) want.dims[size_t(d)] = {"model"}, ++split;
      EXPECT_EQ(plan.spec(path), want) << path << " (" << models::param_kind_name(role.kind) << ", shape "
                                       << value.shape().str() << "): got " << plan.spec(path).str();
      EXPECT_TRUE(plan.spec(path).partial.empty()) << path;
    }
    EXPECT_EQ(split, model > 1 ? m.split_count : 0);
    if (model == 2) {
      for (const auto& [path, spec] : m.expected_on_model2)
        EXPECT_EQ(plan.spec(path), spec) << path << ": got " << plan.spec(path).str() << ", want " << spec.str();
    } else {
      for (const train::PlanEntry& e : plan.entries()) EXPECT_TRUE(e.spec.is_replicated()) << e.path;
    }
  }
}

// The pairing in communication: a forward pass under the plan with the batch split over
// "data" costs one all-reduce over "model" per column/row pair (plus the embeddings') and no
// gather; nothing at all over "data".
TEST(ModelShardingRules, ColumnRowPairsCostOneAllReduceEach) {
  Mesh mesh = test_mesh();
  if (!mesh.has_axis("model")) GTEST_SKIP() << "no model axis on " << mesh.str();
  for (const ModelCase& m : all_cases()) {
    SCOPED_TRACE(m.name);
    Params params = train::auto_sharding_rules(m.params, mesh, m.roles).shard(m.params);
    Array ids = dist::shard(m.batch[0], mesh, PartitionSpec{"data", ""});
    mesh.axis_comm("model").reset_stats();
    mesh.axis_comm("data").reset_stats();
    Array out = m.forward(params, ids);
    const dist::CommStats s = mesh.axis_comm("model").stats();
    if (dist::world().rank() == 0)
      std::cout << "  " << m.name << " forward over model: " << s.all_reduce.calls << " all-reduce, "
                << s.all_gather.calls << " all-gather, " << s.reduce_scatter.calls << " reduce-scatter\n";
    EXPECT_EQ(mesh.axis_comm("data").stats().total_calls(), 0);
    if (m.paired_forward_all_reduces < 0) continue;  // known extra cost (see the model's case)
    EXPECT_EQ(s.all_reduce.calls, m.paired_forward_all_reduces);
    EXPECT_EQ(s.total_calls(), s.all_reduce.calls);
  }
}

struct RunResult {
  std::vector<double> losses;
  Params params;
};

RunResult train_steps(const ModelCase& m, Params params, const std::vector<Array>& batch) {
  optim::Transform opt = tiny_gpt_optimizer();
  Params state = opt.init(params);
  RunResult r;
  const PrecisionPolicy& policy = precision_policy();  // bf16: cast once per step, as the Trainer does
  for (uint64_t s = 0; s < 3; ++s) {
    const Params compute = policy.cast_for_compute(params);
    auto [loss, grads] = value_and_grad([&](const Params& p) {
      return cast(m.loss(policy.compute_view(p, compute), batch, s), DType::f32);
    })(params);
    params = optim::apply_updates(params, opt.update(grads, state, params));
    r.losses.push_back(dist::to_host(loss).item());
  }
  r.params = std::move(params);
  return r;
}

void expect_plan_trains_like_one_device(double loss_rtol, double param_tol, const char* what) {
  Mesh mesh = test_mesh();
  for (const ModelCase& m : all_cases()) {
    SCOPED_TRACE(m.name);
    train::ShardingPlan plan = train::auto_sharding_rules(m.params, mesh, m.roles);
    std::vector<Array> sharded_batch;
    for (const Array& a : m.batch) {
      PartitionSpec spec;
      spec.dims.assign(size_t(a.ndim()), {});
      spec.dims[0] = {"data"};
      sharded_batch.push_back(dist::shard(a, mesh, spec));
    }
    RunResult ref = train_steps(m, m.params, m.batch);
    RunResult got = train_steps(m, plan.shard(m.params), sharded_batch);
    double err = 0, loss_err = 0;
    for (size_t i = 0; i < ref.losses.size(); ++i)
      loss_err = std::max(loss_err, std::abs(ref.losses[i] - got.losses[i]) / std::abs(ref.losses[i]));
    for (const auto& [path, w] : ref.params) {
      // The optimizer keeps each parameter in the plan's layout (no silent gather).
      if (!plan.spec(path).is_replicated()) {
        const dist::Sharding* sh = dist::sharding_of(got.params[path]);
        EXPECT_TRUE(sh && sh->spec == plan.spec(path)) << path << ": " << (sh ? sh->str() : "not sharded");
      }
      auto a = w.to_doubles(), b = dist::to_host(got.params[path]).to_doubles();
      for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
    }
    if (dist::world().rank() == 0)
      std::cout << "  [max err] " << m.name << " automatic plan on " << mesh.str() << ", " << what << " (losses "
                << ref.losses[0] << " -> " << ref.losses.back() << "): loss " << loss_err << " relative, params "
                << err << "\n";
    EXPECT_LE(loss_err, loss_rtol);
    EXPECT_LE(err, param_tol);
    EXPECT_LT(ref.losses.back(), ref.losses.front());  // the steps train
  }
}

TEST(ModelShardingRules, AutomaticPlanTrainsLikeOneDevice) { expect_plan_trains_like_one_device(1e-5, 2e-5, "f32"); }

// Mixed precision (bf16 compute over f32 masters) on the same plans: sharded sums round their
// bf16 outputs in another order, so the runs agree to bf16's tolerance, not bit for bit. The
// losses within 2e-2 relative; a parameter within 2 · steps · lr: Adam moves each by about lr a
// step whatever its gradient's size, so a tiny gradient whose sign the rounding flips moves it
// the other way.
TEST(ModelShardingRules, AutomaticPlanTrainsLikeOneDeviceInBf16) {
  PrecisionScope bf16(precision_policy_from_name("bf16"));
  expect_plan_trains_like_one_device(2e-2, 2 * 3 * 1e-2, "bf16 mixed precision");
}

}  // namespace
}  // namespace mt::testing
