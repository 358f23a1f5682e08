// Hugging Face `transformers`' own model classes as twins (PyPI, in the project's .venv;
// tests/python/transformers_twin.py): a small model of each family with random weights of
// unit-ish scale is written by meshtrain's save_pretrained, loaded by transformers into the
// class its config.json names (BertForSequenceClassification, BertForMaskedLM,
// GPT2LMHeadModel, LlamaForCausalLM, T5ForConditionalGeneration v1.0 and v1.1,
// BartForConditionalGeneration), and both run the same padded batch: logits, the loss HF
// computes from `labels`, and every parameter's gradient of loss + sum(logits * cotangent)
// agree to 1e-5. (tests/support/model_twins.py holds the twins written here; these are the
// library's own code.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <filesystem>
#include <string>

#include "meshtrain/io/safetensors.h"
#include "meshtrain/models/pretrained.h"
#include "tests/support/model_twins.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

using namespace mt::models;
using nlohmann::json;

constexpr int64_t kVocab = 99;

// The batch both sides see. Row 1 is right-padded: its last `pad` tokens are masked out.
struct Batch {
  Array ids, mask, labels;                    // labels in HF's convention (the model shifts them for decoders)
  Array decoder_ids, decoder_mask;            // encoder-decoders
  Array position_ids;                         // decoders: arange, given to both sides
  Array pixel_values;                         // image models: (B, C, H, W) f32 instead of ids
  Array encoder_states, encoder_mask;         // decoders with cross-attention: (B, S, C) f32, (B, S)
};

Array ints(const std::vector<int64_t>& v, int64_t b, int64_t t) { return Array::from_vector(v, Shape{b, t}); }

std::vector<int64_t> token_ids(int64_t n, uint64_t seed, int64_t low, int64_t vocab = kVocab) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = low + int64_t((s >> 33) % uint64_t(vocab - low));
  }
  return v;
}

std::vector<int64_t> right_padded_mask(int64_t b, int64_t t, int64_t pad) {
  std::vector<int64_t> m(size_t(b * t), 1);
  for (int64_t j = t - pad; j < t; ++j) m[size_t(t + j)] = 0;  // row 1
  return m;
}

// Runs transformers on `dir` with `inputs`; returns OUT.safetensors' tensors.
Params run_transformers(const std::filesystem::path& dir, const Params& inputs) {
  const std::string in = (dir / "twin_in.safetensors").string(), out = (dir / "twin_out.safetensors").string();
  io::save_safetensors(in, inputs);
  const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/transformers_twin.py " +
                          (dir / "model").string() + " " + in + " " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) throw Error("transformers twin failed (exit " + std::to_string(rc) + "): " + cmd);
  return io::load_safetensors(out);
}

using ModelFn = std::function<Array(const PretrainedModel&, const Params&)>;

// The model of `config` with random weights of unit-ish scale.
PretrainedModel random_model(const json& config, double weight_scale) {
  PretrainedModel m = init_model(config, {.load_tokenizer = false, .print_report = false});
  m.params = random_model_params(m.param_defs(), 7, weight_scale);
  return m;
}

// Saves `m` as a HF folder under `dir`, runs both sides and compares. `meshtrain_logits` /
// `meshtrain_loss` run meshtrain's model.
// Tolerances: logits and loss 1e-5 (+ 1e-5 relative), gradients the model twins' standard
// (1e-5 + 1e-4 relative + 2e-6 of the largest gradient). A trained checkpoint's peaked logits
// and large gradients pass `scaled` (a fraction of the largest magnitude) on top.
void check_against_transformers(const std::filesystem::path& dir_, const std::string& label, const PretrainedModel& m,
                                const Batch& batch, const ModelFn& meshtrain_logits, const ModelFn& meshtrain_loss,
                                const std::string& hf_class, double scaled = 0) {
    save_pretrained(m, (dir_ / "model").string());
    const json saved = json::parse(std::ifstream(dir_ / "model" / "config.json"));
    ASSERT_EQ(saved.at("architectures")[0].get<std::string>(), hf_class) << saved.dump();

    Array logits = meshtrain_logits(m, m.params);
    Array cot = random_normal(logits.shape(), 4321);
    Params in{{"labels", batch.labels}, {"cotangent", cot}};
    if (batch.ids.defined()) in.set("input_ids", batch.ids);
    if (batch.pixel_values.defined()) in.set("pixel_values", batch.pixel_values);
    if (batch.encoder_states.defined()) in.set("encoder_hidden_states", batch.encoder_states);
    if (batch.encoder_mask.defined()) in.set("encoder_attention_mask", batch.encoder_mask);
    if (batch.mask.defined()) in.set("attention_mask", batch.mask);
    if (batch.position_ids.defined()) in.set("position_ids", batch.position_ids);
    if (batch.decoder_ids.defined()) in.set("decoder_input_ids", batch.decoder_ids);
    if (batch.decoder_mask.defined()) in.set("decoder_attention_mask", batch.decoder_mask);
    const Params hf = run_transformers(dir_, in);

    const double logits_err = expect_close(logits, hf["logits"], {1e-5, 1e-5, scaled}, label + " logits");
    // How far each f32 run is from the f64 one: meshtrain may not be further than transformers.
    // (BART does not run in f64 in this transformers: no such check there.)
    double ours_f64 = -1, theirs_f64 = -1;
    if (hf.contains("logits_f64")) {
      ours_f64 = expect_close(logits, hf["logits_f64"], {1e-5, 1e-5, scaled}, label + " logits vs f64");
      const auto a = hf["logits"].to_floats(), b = hf["logits_f64"].to_floats();
      theirs_f64 = 0;
      for (size_t i = 0; i < a.size(); ++i) theirs_f64 = std::max(theirs_f64, double(std::abs(a[i] - b[i])));
      EXPECT_LE(ours_f64, 2 * theirs_f64 + 1e-6) << label << ": meshtrain is further from the f64 logits than transformers";
    }
    Array loss = meshtrain_loss(m, m.params);
    const double loss_err = expect_close(reshape(loss, {1}), hf["loss"], {1e-5, 1e-5}, label + " loss");
    auto [value, grads] = value_and_grad([&](const Params& p) {
      return add(meshtrain_loss(m, p), sum(mul(meshtrain_logits(m, p), cot)));
    })(m.params);
    // Gradients in the layout save_pretrained wrote (a permutation of rows moves them alike).
    if (m.spec().to_hf_layout) grads = m.spec().to_hf_layout(m.config, grads).second;
    double grad_err = 0;
    std::string worst;
    size_t compared = 0, hf_grads = 0;
    for (const auto& [path, g] : hf) hf_grads += path.rfind("grad.", 0) == 0;
    // A key projection's bias shifts every score of a query's row alike, which the softmax
    // cancels: its gradient is exactly zero, and both sides compute round-off whose size
    // follows the model's gradients, not its own (BERT MLM on an AVX2 CPU: 1.2e-5 where the
    // largest gradient is 137). Those are held to 1e-6 of the largest gradient.
    double largest_grad = 0;
    for (const auto& [path, g] : hf)
      if (path.rfind("grad.", 0) == 0)
        for (float v : g.to_floats()) largest_grad = std::max(largest_grad, double(std::abs(v)));
    const std::regex shift_invariant(".*(attention\\.self\\.key|\\.k_proj|\\.k)\\.bias");
    for (const auto& [path, v] : m.params) {
      const auto& buffers = m.spec().buffers;  // loaded, never trained (BART's final_logits_bias)
      if (std::any_of(buffers.begin(), buffers.end(), [&](const std::string& b) { return std::regex_match(path, std::regex(b)); }))
        continue;
      if (!hf.contains("grad." + path)) {
        ADD_FAILURE() << label << ": transformers has no parameter (or no gradient) named " << path;
        continue;
      }
      // Same elements in HF's order; meshtrain may group dimensions (GPT-2's c_attn [in, 3, out]).
      const Array ref = reshape(hf["grad." + path], v.shape().dims());
      // Other gradients sum hundreds of f32 products whose round-off follows the parameter's
      // largest gradient: 4e-6 of it (BART's cross-attention q_proj on an AVX-512 EPYC, where
      // both sides' GEMMs run AVX-512 kernels: 3.5e-5 off where its largest is about 12).
      const Tolerance tolerance = std::regex_match(path, shift_invariant)
                                      ? Tolerance{std::max(1e-5, 1e-6 * largest_grad), 1e-4, 0}
                                      : Tolerance{1e-5, 1e-4, std::max(4e-6, scaled)};
      const double e = expect_close(grads[path], ref, tolerance, label + " d/d" + path);
      ++compared;
      if (e >= grad_err) grad_err = e, worst = path;
    }
    EXPECT_EQ(compared, hf_grads) << label << ": transformers has parameters meshtrain lacks";
    double max_logit = 0, max_grad = 0;
    for (float v : hf["logits"].to_floats()) max_logit = std::max(max_logit, double(std::abs(v)));
    for (const auto& [path, g] : hf)
      if (path.rfind("grad.", 0) == 0)
        for (float v : g.to_floats()) max_grad = std::max(max_grad, double(std::abs(v)));
    std::cout << "[transformers twin] " << label << " (" << hf_class << "): max |logit| " << max_logit << ", max |grad| "
              << max_grad << "; max |logits err| " << logits_err << " (vs f64: ours " << ours_f64 << ", theirs "
              << theirs_f64 << ")"
              << ", |loss err| " << loss_err << " (loss " << loss.to_floats()[0] << "), max |grad err| " << grad_err
              << " (" << worst << ") over " << compared << " parameters\n";
}

using TransformersTwin = TempDir;

Batch bert_batch(bool mlm) {
  const int64_t b = 2, t = 7;
  Batch x;
  std::vector<int64_t> ids = token_ids(b * t, 11, 5);
  const auto mask = right_padded_mask(b, t, 2);
  for (size_t k = 0; k < ids.size(); ++k)
    if (!mask[k]) ids[k] = 0;  // [PAD]: nn.Embedding's padding_idx passes no gradient there
  x.ids = ints(ids, b, t);
  x.mask = ints(mask, b, t);
  if (mlm) {
    std::vector<int64_t> labels(size_t(b * t), -100);
    const auto ids = x.ids.to_ints();
    for (size_t k : {1u, 3u, 4u, 8u, 10u}) labels[k] = ids[k];  // the masked-LM positions (real tokens)
    x.labels = ints(labels, b, t);
  } else {
    x.labels = Array::from_vector(std::vector<int64_t>{2, 0}, Shape{b});
  }
  return x;
}

json bert_config(const std::string& arch) {
  return {{"model_type", "bert"},         {"architectures", {arch}},      {"vocab_size", kVocab},
          {"hidden_size", 32},            {"num_hidden_layers", 2},       {"num_attention_heads", 4},
          {"intermediate_size", 37},      {"max_position_embeddings", 16}, {"type_vocab_size", 2},
          {"hidden_act", "gelu"},         {"layer_norm_eps", 1e-12},      {"num_labels", 3},
          {"hidden_dropout_prob", 0.1},   {"attention_probs_dropout_prob", 0.1}, {"pad_token_id", 0}};
}

Array bert_logits(const PretrainedModel& m, const Params& p, const Batch& x) {
  return bert_apply(m.config.as<BertConfig>(), p, BertInputs{.input_ids = x.ids, .attention_mask = x.mask}).logits;
}

TEST_F(TransformersTwin, BertForSequenceClassification) {
  const Batch x = bert_batch(false);
  auto logits = [&](const PretrainedModel& m, const Params& p) { return bert_logits(m, p, x); };
  check_against_transformers(dir_, "BERT classifier", random_model(bert_config("BertForSequenceClassification"), 0.3),
                             x, logits,
        [&](const PretrainedModel& m, const Params& p) { return cross_entropy(logits(m, p), x.labels); },
        "BertForSequenceClassification");
}

TEST_F(TransformersTwin, BertForMaskedLM) {
  const Batch x = bert_batch(true);
  auto logits = [&](const PretrainedModel& m, const Params& p) { return bert_logits(m, p, x); };
  check_against_transformers(dir_, "BERT masked LM", random_model(bert_config("BertForMaskedLM"), 0.3), x, logits,
        [&](const PretrainedModel& m, const Params& p) { return cross_entropy(logits(m, p), x.labels); },
        "BertForMaskedLM");
}

json vit_config(const std::string& arch) {
  return {{"model_type", "vit"},          {"architectures", {arch}},   {"hidden_size", 32},
          {"num_hidden_layers", 2},       {"num_attention_heads", 4},  {"intermediate_size", 37},
          {"image_size", 12},             {"patch_size", 4},           {"num_channels", 3},
          {"hidden_act", "gelu"},         {"layer_norm_eps", 1e-12},   {"num_labels", 5},
          {"hidden_dropout_prob", 0.1},   {"attention_probs_dropout_prob", 0.1}, {"qkv_bias", true}};
}

// ViT-GPT2's image side: patches through a strided convolution (kept as a Linear over
// flattened patches), [CLS], learned positions, pre-norm blocks, the classifier on [CLS].
TEST_F(TransformersTwin, ViTForImageClassification) {
  Batch x;
  x.pixel_values = random_normal({3, 3, 12, 12}, 77);
  x.labels = Array::from_vector(std::vector<int64_t>{4, 0, 2}, Shape{3});
  auto logits = [&](const PretrainedModel& m, const Params& p) {
    return vit_apply(m.config.as<VitConfig>(), p, x.pixel_values).logits;
  };
  check_against_transformers(dir_, "ViT classifier", random_model(vit_config("ViTForImageClassification"), 0.3), x,
                             logits,
        [&](const PretrainedModel& m, const Params& p) { return cross_entropy(logits(m, p), x.labels); },
        "ViTForImageClassification");
}

// ViT-GPT2 as transformers' VisionEncoderDecoderModel: a ViT encoder 24 wide (projected to the
// decoder's 32 by enc_to_dec_proj), GPT-2 with cross-attention; teacher-forced logits, the loss
// against labels (-100 ignored) and every parameter's gradient.
TEST_F(TransformersTwin, VisionEncoderDecoderModel) {
  json enc = vit_config("ViTModel");
  enc["hidden_size"] = 24, enc["num_attention_heads"] = 3, enc["intermediate_size"] = 29;
  json dec = {{"model_type", "gpt2"}, {"vocab_size", kVocab}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4},
              {"n_positions", 16}, {"add_cross_attention", true}, {"is_decoder", true}, {"bos_token_id", 1},
              {"eos_token_id", 2}};
  const json config = {{"model_type", "vision-encoder-decoder"}, {"architectures", {"VisionEncoderDecoderModel"}},
                       {"encoder", enc}, {"decoder", dec}, {"decoder_start_token_id", 1}, {"pad_token_id", 2},
                       {"eos_token_id", 2}};
  Batch x;
  x.pixel_values = random_normal({2, 3, 12, 12}, 78);
  x.labels = ints({5, 9, 14, 3, 7, 2, 11, 6, 2, -100, -100, -100}, 2, 6);
  const Array decoder_ids = shift_right(x.labels, 1, 2);
  EXPECT_EQ(decoder_ids.to_ints(), (std::vector<int64_t>{1, 5, 9, 14, 3, 7, 1, 11, 6, 2, 2, 2}));
  x.decoder_ids = decoder_ids;
  auto logits = [&](const PretrainedModel& m, const Params& p) {
    return vision_encoder_decoder_logits(m.config.as<VisionEncoderDecoderConfig>(), p, x.pixel_values, decoder_ids);
  };
  check_against_transformers(dir_, "ViT-GPT2", random_model(config, 0.3), x, logits,
        [&](const PretrainedModel& m, const Params& p) { return cross_entropy(logits(m, p), x.labels); },
        "VisionEncoderDecoderModel");
}

// Captioning as transformers' generate does it: greedy and beam search over the images, with
// the cross-attention keys and values cached (equal to recomputing every step without a cache).
TEST_F(TransformersTwin, VisionEncoderDecoderGeneratesAsTransformers) {
  json enc = vit_config("ViTModel");
  enc["hidden_size"] = 24, enc["num_attention_heads"] = 3, enc["intermediate_size"] = 29;
  json dec = {{"model_type", "gpt2"}, {"vocab_size", kVocab}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4},
              {"n_positions", 16}, {"add_cross_attention", true}, {"is_decoder", true}, {"bos_token_id", 1},
              {"eos_token_id", 2}};
  const json config = {{"model_type", "vision-encoder-decoder"}, {"encoder", enc}, {"decoder", dec},
                       {"decoder_start_token_id", 1}, {"pad_token_id", 2}, {"eos_token_id", 2}};
  const PretrainedModel m = random_model(config, 1.0);
  save_pretrained(m, (dir_ / "model").string());
  const Array pixels = random_normal({3, 3, 12, 12}, 79);
  const std::string in = (dir_ / "pixels.safetensors").string(), out = (dir_ / "captions.safetensors").string();
  io::save_safetensors(in, Params{{"pixel_values", pixels}});
  const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/caption_generate.py " +
                          (dir_ / "model").string() + " " + in + " " + out + " 10 3 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const Params hf = io::load_safetensors(out);
  auto rows_of = [](const Array& a) {
    std::vector<std::vector<int64_t>> rows;
    const std::vector<int64_t> v = a.to_ints();
    for (int64_t r = 0; r < a.dim(0); ++r) {
      std::vector<int64_t> row;
      for (int64_t t = 0; t < a.dim(1) && v[size_t(r * a.dim(1) + t)] >= 0; ++t) row.push_back(v[size_t(r * a.dim(1) + t)]);
      rows.push_back(row);
    }
    return rows;
  };
  const auto& c = m.config.as<VisionEncoderDecoderConfig>();
  for (int beams : {1, 3}) {
    GenerationConfig g;
    g.max_new_tokens = 10, g.num_beams = beams;
    const GenerationResult cached = generate_captions(c, m.params, pixels, g);
    g.use_cache = false;
    const GenerationResult recomputed = generate_captions(c, m.params, pixels, g);
    EXPECT_EQ(cached.tokens, recomputed.tokens) << beams << " beams";
    EXPECT_EQ(cached.tokens, rows_of(hf[beams == 1 ? "greedy" : "beams"])) << beams << " beams";
    std::cout << "[captions] " << beams << " beam(s), first: ";
    for (int64_t t : cached.tokens[0]) std::cout << t << " ";
    std::cout << "(transformers equal)\n";
  }
}

// A decoder batch: HF's labels are the ids (-100 at padding) and the model shifts them;
// meshtrain's cross_entropy takes the next-token targets themselves.
Batch decoder_batch(int64_t vocab = kVocab) {
  const int64_t b = 2, t = 9, pad = 3;
  Batch x;
  const auto ids = token_ids(b * t, 23, 3, vocab);
  const auto mask = right_padded_mask(b, t, pad);
  x.ids = ints(ids, b, t);
  x.mask = ints(mask, b, t);
  std::vector<int64_t> labels(ids), pos(size_t(b * t));
  for (size_t k = 0; k < labels.size(); ++k) {
    if (!mask[k]) labels[k] = -100;
    pos[k] = int64_t(k) % t;
  }
  x.labels = ints(labels, b, t);
  x.position_ids = ints(pos, b, t);
  return x;
}

Array next_token_targets(const Array& hf_labels) {
  const int64_t b = hf_labels.dim(0), t = hf_labels.dim(1);
  const auto l = hf_labels.to_ints();
  std::vector<int64_t> next(size_t(b * t), -100);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j + 1 < t; ++j) next[size_t(i * t + j)] = l[size_t(i * t + j + 1)];
  return ints(next, b, t);
}

void check_decoder(const std::filesystem::path& dir, const std::string& label, const PretrainedModel& model,
                   const std::string& hf_class, int64_t vocab = kVocab, double scaled = 0) {
  const Batch x = decoder_batch(vocab);
  const DecoderInputs in{.input_ids = x.ids, .attention_mask = x.mask, .position_ids = x.position_ids};
  const Array targets = next_token_targets(x.labels);
  check_against_transformers(
      dir, label, model, x, [&](const PretrainedModel& m, const Params& p) { return m.decoder_logits(p, in, {}, false); },
      [&](const PretrainedModel& m, const Params& p) { return m.decoder_loss(p, in, targets, {}, false); }, hf_class,
      scaled);
}

TEST_F(TransformersTwin, Gpt2LMHeadModel) {
  check_decoder(dir_, "GPT-2", random_model(
                {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", kVocab},
                 {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4}, {"n_positions", 16}, {"layer_norm_epsilon", 1e-5},
                 {"activation_function", "gelu_new"}, {"bos_token_id", 1}, {"eos_token_id", 1}}, 0.3),
                "GPT2LMHeadModel");
}

// The decoder of a ViT-GPT2 captioner: GPT-2 blocks with cross-attention (ln_cross_attn,
// crossattention.q_attn / c_attn / c_proj) over encoder states, one row's last two masked.
TEST_F(TransformersTwin, Gpt2WithCrossAttention) {
  Batch x = decoder_batch();
  x.encoder_states = random_normal({2, 5, 32}, 91);
  x.encoder_mask = ints({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 2, 5);
  const DecoderInputs in{.input_ids = x.ids, .attention_mask = x.mask, .position_ids = x.position_ids,
                         .encoder_hidden_states = x.encoder_states, .encoder_attention_mask = x.encoder_mask};
  const Array targets = next_token_targets(x.labels);
  const PretrainedModel model = random_model(
      {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", kVocab}, {"n_embd", 32},
       {"n_layer", 2}, {"n_head", 4}, {"n_positions", 16}, {"layer_norm_epsilon", 1e-5},
       {"activation_function", "gelu_new"}, {"bos_token_id", 1}, {"eos_token_id", 1}, {"add_cross_attention", true}},
      0.3);
  check_against_transformers(
      dir_, "GPT-2 + cross-attention", model, x,
      [&](const PretrainedModel& m, const Params& p) { return m.decoder_logits(p, in, {}, false); },
      [&](const PretrainedModel& m, const Params& p) { return m.decoder_loss(p, in, targets, {}, false); },
      "GPT2LMHeadModel");
  // The states are required with cross-attention and refused without it; remat reruns the block
  // from its inputs, so the same logits and gradients come back.
  expect_error([&] { model.decoder_logits(model.params, {.input_ids = x.ids}, {}, false); },
               {"needs encoder_hidden_states (B, S, 32)"});
  const PretrainedModel plain = random_model(
      {{"model_type", "gpt2"}, {"vocab_size", kVocab}, {"n_embd", 32}, {"n_layer", 1}, {"n_head", 4}, {"n_positions", 16}},
      0.3);
  expect_error([&] { plain.decoder_logits(plain.params, in, {}, false); }, {"add_cross_attention is false"});
  PretrainedModel rematted = model;
  rematted.config = model.config.with_remat(Remat::block);
  auto loss_of = [&](const PretrainedModel& m) {
    return [&](const Params& p) {
      DecoderInputs with = in;
      with.encoder_hidden_states = p["memory"];
      Params q = p;
      return m.decoder_loss(q, with, targets, {}, false);
    };
  };
  Params with_memory = model.params;
  with_memory.set("memory", x.encoder_states);
  auto [l0, g0] = value_and_grad(loss_of(model))(with_memory);
  auto [l1, g1] = value_and_grad(loss_of(rematted))(with_memory);
  EXPECT_EQ(max_abs_diff(l0, l1), 0.0);
  EXPECT_LE(max_abs_diff(g0["memory"], g1["memory"]), 1e-6);
  EXPECT_GT(max_abs_diff(g0["memory"], zeros_like(g0["memory"])), 0.0);  // the gradient reaches the encoder
}

// --save-dtype bf16 and f16: the folder holds bf16 (f16) tensors and says torch_dtype bfloat16
// (float16); meshtrain loads it back to f32 exactly as rounded, and transformers computes on it
// what meshtrain does.
TEST_F(TransformersTwin, Gpt2SavedInBf16AndF16LoadsInTransformersAndBack) {
  const PretrainedModel m = random_model(
      {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", kVocab}, {"n_embd", 32},
       {"n_layer", 2}, {"n_head", 4}, {"n_positions", 16}, {"layer_norm_epsilon", 1e-5},
       {"activation_function", "gelu_new"}, {"bos_token_id", 1}, {"eos_token_id", 1}},
      0.3);
  for (const auto& [dtype, torch_name] : {std::pair{DType::bf16, "bfloat16"}, std::pair{DType::f16, "float16"}}) {
    SCOPED_TRACE(torch_name);
    std::filesystem::remove_all(dir_ / "model");
    save_pretrained(m, (dir_ / "model").string(), dtype);
    const json saved = json::parse(std::ifstream(dir_ / "model" / "config.json"));
    EXPECT_EQ(saved.at("torch_dtype").get<std::string>(), torch_name);
    for (const auto& [path, v] : io::load_safetensors((dir_ / "model" / "model.safetensors").string()))
      EXPECT_EQ(v.dtype(), dtype) << path;
    const PretrainedModel back =
        from_pretrained((dir_ / "model").string(), {.load_tokenizer = false, .print_report = false});
    for (const auto& [path, v] : m.params) {
      ASSERT_EQ(back.params[path].dtype(), DType::f32) << path;
      EXPECT_EQ(max_abs_diff(back.params[path], cast(cast(v, dtype), DType::f32)), 0.0) << path;
    }
    const Batch x = decoder_batch();
    const DecoderInputs in{.input_ids = x.ids, .attention_mask = x.mask, .position_ids = x.position_ids};
    Params hf_in{{"input_ids", x.ids}, {"labels", x.labels}, {"attention_mask", x.mask}, {"position_ids", x.position_ids},
                 {"cotangent", Array::zeros(Shape{x.ids.dim(0), x.ids.dim(1), kVocab})}};
    const Params hf = run_transformers(dir_, hf_in);
    const double err = expect_close(back.decoder_logits(back.params, in, {}, false), hf["logits"], {1e-5, 1e-5},
                                    std::string("GPT-2 ") + torch_name + " folder logits");
    std::cout << "[transformers] GPT-2 saved in " << torch_name << ", loaded by both: logits max err " << err << "\n";
  }
}

TEST_F(TransformersTwin, LlamaForCausalLMWithGroupedQueries) {
  check_decoder(dir_, "LLaMA (GQA 4/2)", random_model(
                {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", kVocab},
                 {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
                 {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 32},
                 {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"hidden_act", "silu"},
                 {"tie_word_embeddings", false}, {"bos_token_id", 1}, {"eos_token_id", 2}}, 0.3),
                "LlamaForCausalLM");
}

// llama2.c's stories260K (interleaved rotary pairs, which HF's config cannot say):
// save_pretrained permutes q/k rows to HF's half-split pairs, so transformers' LLaMA computes
// what meshtrain's interleaved model does.
TEST_F(TransformersTwin, Llama2cModelSavedForTransformers) {
  PretrainedModel m = load_llama2c_model(std::string(MT_DATA_DIR) + "/models/stories260K/stories260K.bin",
                                         {.load_tokenizer = false, .print_report = false});
  ASSERT_TRUE(m.config.as<LlamaConfig>().rope_interleaved);
  // Trained weights: logits up to ~15 and gradients up to ~7,000 on random tokens, so the
  // tolerances also scale with the largest magnitude (1e-5 of it).
  check_decoder(dir_, "llama2.c stories260K", m, "LlamaForCausalLM", m.config.as<LlamaConfig>().vocab_size, 1e-5);
  const json saved = json::parse(std::ifstream(dir_ / "model" / "config.json"));
  EXPECT_FALSE(saved.at("rotary_interleaved").get<bool>());
  // Loaded back, meshtrain's half-split model computes the interleaved one's logits.
  PretrainedModel back = from_pretrained((dir_ / "model").string(), {.load_tokenizer = false, .print_report = false});
  const Array ids = Array::from_vector(std::vector<int64_t>{1, 403, 407, 261, 378, 300}, Shape{1, 6});
  expect_close(back.decoder_logits(back.params, {.input_ids = ids}, {}, false),
               m.decoder_logits(m.params, {.input_ids = ids}, {}, false), {1e-5, 1e-5, 1e-5}, "stories260K reloaded");
}

// An encoder-decoder batch: source right-padded in row 1; decoder inputs start with the
// decoder start token, labels are the targets (-100 at the target's padding), unshifted.
Batch seq2seq_batch(int64_t start, int64_t pad_id) {
  const int64_t b = 2, s = 8, t = 6;
  Batch x;
  std::vector<int64_t> src = token_ids(b * s, 31, 3), tgt = token_ids(b * t, 37, 3);
  const auto smask = right_padded_mask(b, s, 3), tmask = right_padded_mask(b, t, 2);
  for (size_t k = 0; k < src.size(); ++k)
    if (!smask[k]) src[k] = pad_id;
  std::vector<int64_t> dec(size_t(b * t)), labels(size_t(b * t));
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < t; ++j) {
      const size_t k = size_t(i * t + j);
      labels[k] = tmask[k] ? tgt[k] : -100;
      dec[k] = j == 0 ? start : (tmask[k - 1] ? tgt[k - 1] : pad_id);
    }
  x.ids = ints(src, b, s);
  x.mask = ints(smask, b, s);
  x.decoder_ids = ints(dec, b, t);
  x.labels = ints(labels, b, t);
  return x;
}

// T5 does not scale attention scores by 1/sqrt(d): its weights are drawn smaller (as in
// seq2seq_oracle_test) so f32 round-off stays near the tolerance's scale.
void check_seq2seq(const std::filesystem::path& dir, const std::string& label, const json& config, int64_t start,
                   int64_t pad_id, const std::string& hf_class, double weight_scale = 0.3) {
  const Batch x = seq2seq_batch(start, pad_id);
  const Seq2SeqInputs in{.input_ids = x.ids, .attention_mask = x.mask, .decoder_input_ids = x.decoder_ids};
  check_against_transformers(
      dir, label, random_model(config, weight_scale), x,
      [&](const PretrainedModel& m, const Params& p) { return m.seq2seq_logits(p, in, {}, false); },
      [&](const PretrainedModel& m, const Params& p) { return m.seq2seq_loss(p, in, x.labels, {}, false); }, hf_class);
}

json t5_config(const std::string& ffn, bool tied) {
  return {{"model_type", "t5"},         {"architectures", {"T5ForConditionalGeneration"}},
          {"vocab_size", kVocab},       {"d_model", 32},
          {"d_kv", 8},                  {"d_ff", 48},
          {"num_layers", 2},            {"num_decoder_layers", 2},
          {"num_heads", 4},             {"relative_attention_num_buckets", 8},
          {"relative_attention_max_distance", 20}, {"layer_norm_epsilon", 1e-6},
          {"feed_forward_proj", ffn},   {"tie_word_embeddings", tied},
          {"dropout_rate", 0.1},        {"pad_token_id", 0},
          {"eos_token_id", 1},          {"decoder_start_token_id", 0}};
}

TEST_F(TransformersTwin, T5v1_0ForConditionalGeneration) {
  check_seq2seq(dir_, "T5 v1.0 (relu, tied)", t5_config("relu", true), 0, 0, "T5ForConditionalGeneration",
                0.15);
}

TEST_F(TransformersTwin, T5v1_1ForConditionalGeneration) {
  check_seq2seq(dir_, "T5 v1.1 (gated-gelu, untied)", t5_config("gated-gelu", false), 0, 0,
                "T5ForConditionalGeneration", 0.15);
}

TEST_F(TransformersTwin, BartForConditionalGeneration) {
  check_seq2seq(dir_, "BART",
                {{"model_type", "bart"}, {"architectures", {"BartForConditionalGeneration"}}, {"vocab_size", kVocab},
                 {"d_model", 32}, {"encoder_layers", 2}, {"decoder_layers", 2}, {"encoder_attention_heads", 4},
                 {"decoder_attention_heads", 4}, {"encoder_ffn_dim", 48}, {"decoder_ffn_dim", 48},
                 {"max_position_embeddings", 32}, {"activation_function", "gelu"}, {"scale_embedding", false},
                 {"pad_token_id", 1}, {"bos_token_id", 0}, {"eos_token_id", 2}, {"decoder_start_token_id", 2},
                 {"forced_eos_token_id", 2}, {"dropout", 0.1}, {"attention_dropout", 0.1}},
                2, 1, "BartForConditionalGeneration");
}

}  // namespace
}  // namespace mt::testing
