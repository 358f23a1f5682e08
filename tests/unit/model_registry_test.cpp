// The model registry: every registered model_type round-trips its config, declares its
// parameters, and (decoders) runs forward and generation from the small config `pretrain`
// starts from; unknown types are errors naming the known ones. Loops over the registry, so
// a new model is covered by registering it.
#include <gtest/gtest.h>

#include "meshtrain/models/pretrained.h"
#include "tests/support/op_check.h"

namespace mt::testing {
namespace {

using namespace mt::models;

// A small config of every model: decoders and encoder-decoders from their own small
// configs, BERT from its keys.
nlohmann::json small_config(const ModelSpec& spec) {
  if (spec.small_config) return spec.small_config(64, 16, 0);
  if (spec.small_seq2seq_config) return spec.small_seq2seq_config(64, 0, 1);
  return {{"model_type", spec.model_type}, {"vocab_size", 64},         {"hidden_size", 32},
          {"num_hidden_layers", 2},        {"num_attention_heads", 4}, {"intermediate_size", 64},
          {"max_position_embeddings", 16}, {"type_vocab_size", 2}};
}

TEST(ModelRegistry, EveryModelRoundTripsItsConfigAndDeclaresItsParameters) {
  ASSERT_GE(model_specs().size(), 4u);
  for (const ModelSpec* spec : model_specs()) {
    SCOPED_TRACE(spec->model_type);
    EXPECT_EQ(&model_spec(spec->model_type), spec);
    EXPECT_FALSE(spec->display_name.empty());
    const nlohmann::json j = small_config(*spec);
    const ModelConfig c = spec->parse_config(j, PretrainedOptions{});
    const nlohmann::json back = spec->config_json(c);
    EXPECT_EQ(back.value("model_type", ""), spec->model_type);
    EXPECT_EQ(spec->config_json(spec->parse_config(back, PretrainedOptions{})), back) << "config.json round trip";
    EXPECT_FALSE(spec->architecture(c).empty());
    const std::vector<ParamDef> defs = spec->param_defs(c);
    EXPECT_GT(defs.size(), 3u);
    // Loading its own freshly initialized parameters reports nothing missing or unexpected.
    PretrainedOptions po;
    po.print_report = false;
    PretrainedModel m = model_from_checkpoint(j, init_params(defs, {1, 0}), "memory", po);
    EXPECT_TRUE(m.report.complete()) << m.report.str(m.architecture, m.source);
    EXPECT_EQ(m.is_causal_lm(), spec->kind == ModelKind::decoder);
    EXPECT_EQ(m.param_roles().size(), defs.size());
  }
}

TEST(ModelRegistry, DecodersRunForwardAndGenerationFromTheirSmallConfig) {
  const std::vector<const ModelSpec*> decoders = model_specs(ModelKind::decoder);
  EXPECT_EQ(model_types(ModelKind::decoder), (std::vector<std::string>{"minigpt", "gpt2", "llama"}));
  for (const ModelSpec* spec : decoders) {
    SCOPED_TRACE(spec->model_type);
    ASSERT_TRUE(spec->causal_lm && spec->decoder_hidden && spec->decoder_head && !spec->head_prefixes.empty() && spec->small_config);
    PretrainedOptions po;
    po.print_report = false;
    const nlohmann::json j = spec->small_config(64, 16, 0);
    PretrainedModel m = model_from_checkpoint(j, init_params(spec->param_defs(spec->parse_config(j, po)), {2, 0}), "memory", po);
    Array ids = Array::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
    Array logits = m.decoder_logits(m.params, {.input_ids = ids}, {}, false);
    EXPECT_EQ(logits.shape(), Shape({2, 3, 64}));
    // The generation closure sees the same model: its logits equal the direct forward's.
    expect_close(m.causal_lm().forward({.input_ids = ids}, nullptr), logits, {0, 0}, spec->model_type + " causal_lm");
  }
  for (const ModelSpec* spec : model_specs(ModelKind::encoder)) {
    SCOPED_TRACE(spec->model_type);
    EXPECT_FALSE(spec->causal_lm || spec->decoder_hidden || spec->decoder_head || spec->small_config);
    EXPECT_FALSE(spec->seq2seq_lm || spec->seq2seq_hidden || spec->small_seq2seq_config);
  }
}

TEST(ModelRegistry, EncoderDecodersRunTeacherForcingAndStepwiseDecodingFromTheirSmallConfig) {
  EXPECT_EQ(model_types(ModelKind::seq2seq), (std::vector<std::string>{"t5", "bart"}));
  for (const ModelSpec* spec : model_specs(ModelKind::seq2seq)) {
    SCOPED_TRACE(spec->model_type);
    ASSERT_TRUE(spec->seq2seq_lm && spec->seq2seq_hidden && spec->decoder_head && !spec->head_prefixes.empty() &&
                spec->small_seq2seq_config);
    EXPECT_FALSE(spec->causal_lm || spec->decoder_hidden || spec->small_config);
    PretrainedOptions po;
    po.print_report = false;
    const nlohmann::json j = spec->small_seq2seq_config(64, 0, 1);
    PretrainedModel m = model_from_checkpoint(j, init_params(spec->param_defs(spec->parse_config(j, po)), {2, 0}), "memory", po);
    EXPECT_TRUE(m.is_seq2seq());
    Array src = Array::from_vector(std::vector<int64_t>{5, 6, 7, 1, 8, 9, 1, 0}, {2, 4});
    Array mask = Array::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 0}, {2, 4});
    Array dec = Array::from_vector(std::vector<int64_t>{0, 3, 4, 0, 5, 6}, {2, 3});
    Array logits = m.seq2seq_logits(m.params, {.input_ids = src, .attention_mask = mask, .decoder_input_ids = dec}, {}, false);
    EXPECT_EQ(logits.shape(), Shape({2, 3, 64}));
    // The generation closures see the same model.
    const Seq2SeqLm lm = m.seq2seq_lm();
    expect_close(lm.decode(dec, lm.encode(src, mask), nullptr), logits, {0, 0}, spec->model_type + " seq2seq_lm");
    expect_error([&] { m.causal_lm(); }, {"not a causal language model"});
  }
}

TEST(ModelRegistry, UnknownTypesNameTheKnownOnes) {
  expect_error([] { model_spec("mbart"); }, {"unknown model_type 'mbart'", "minigpt, gpt2, llama, bert, t5, bart, vit or vision-encoder-decoder"});
  EXPECT_EQ(model_types_text(ModelKind::image_to_text), "vision-encoder-decoder");
  EXPECT_EQ(model_types_text(ModelKind::vision), "vit");
  EXPECT_EQ(model_types_text(ModelKind::seq2seq), "t5 or bart");
  EXPECT_EQ(model_types_text(ModelKind::decoder), "minigpt, gpt2 or llama");
}

}  // namespace
}  // namespace mt::testing
