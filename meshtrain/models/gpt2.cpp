#include "meshtrain/models/gpt2.h"

#include <cmath>

#include "meshtrain/models/lora.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/fused_ops.h"
#include "meshtrain/ops/indexing.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/nn_ops.h"
#include "meshtrain/ops/random.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

Gpt2Config Gpt2Config::from_json(const nlohmann::json& j) {
  const char* w = "gpt2 config";
  Gpt2Config c;
  c.vocab_size = config_get<int64_t>(j, "vocab_size", w);
  c.n_embd = config_get<int64_t>(j, "n_embd", w);
  c.n_layer = config_get<int64_t>(j, "n_layer", w);
  c.n_head = config_get<int64_t>(j, "n_head", w);
  // Old configs name the context n_ctx.
  c.n_positions = j.contains("n_positions") ? config_get<int64_t>(j, "n_positions", w) : config_get<int64_t>(j, "n_ctx", w);
  c.n_inner = config_get<int64_t>(j, "n_inner", w, 0);
  c.activation_function = config_get<std::string>(j, "activation_function", w, "gelu_new");
  c.resid_pdrop = config_get<double>(j, "resid_pdrop", w, 0.1);
  c.embd_pdrop = config_get<double>(j, "embd_pdrop", w, 0.1);
  c.attn_pdrop = config_get<double>(j, "attn_pdrop", w, 0.1);
  c.layer_norm_epsilon = config_get<double>(j, "layer_norm_epsilon", w, 1e-5);
  c.initializer_range = config_get<double>(j, "initializer_range", w, 0.02);
  c.scale_attn_weights = config_get<bool>(j, "scale_attn_weights", w, true);
  c.scale_attn_by_inverse_layer_idx = config_get<bool>(j, "scale_attn_by_inverse_layer_idx", w, false);
  c.add_cross_attention = config_get<bool>(j, "add_cross_attention", w, false);
  c.bos_token_id = config_get<int64_t>(j, "bos_token_id", w, 50256);
  c.eos_token_id = config_get<int64_t>(j, "eos_token_id", w, 50256);
  c.validate();
  return c;
}

nlohmann::json Gpt2Config::to_json() const {
  // architectures: the class transformers' from_pretrained and pipelines instantiate.
  nlohmann::json j = {{"model_type", "gpt2"},
          {"architectures", {"GPT2LMHeadModel"}},
          {"vocab_size", vocab_size},
          {"n_positions", n_positions},
          {"n_embd", n_embd},
          {"n_layer", n_layer},
          {"n_head", n_head},
          {"n_inner", n_inner > 0 ? nlohmann::json(n_inner) : nlohmann::json(nullptr)},
          {"activation_function", activation_function},
          {"resid_pdrop", resid_pdrop},
          {"embd_pdrop", embd_pdrop},
          {"attn_pdrop", attn_pdrop},
          {"layer_norm_epsilon", layer_norm_epsilon},
          {"initializer_range", initializer_range},
          {"scale_attn_weights", scale_attn_weights},
          {"scale_attn_by_inverse_layer_idx", scale_attn_by_inverse_layer_idx},
          {"bos_token_id", bos_token_id},
          {"eos_token_id", eos_token_id}};
  // Written only when set (a decoder of an image captioner): a language model's config keeps
  // transformers' keys and nothing else.
  if (add_cross_attention) j["add_cross_attention"] = true;
  return j;
}

void Gpt2Config::validate() const {
  MT_CHECK(vocab_size > 0 && n_embd > 0 && n_layer > 0 && n_head > 0 && n_positions > 0, "[gpt2 config] sizes must be "
           "positive: vocab_size ", vocab_size, ", n_embd ", n_embd, ", n_layer ", n_layer, ", n_head ", n_head,
           ", n_positions ", n_positions);
  MT_CHECK(n_embd % n_head == 0, "[gpt2 config] n_embd ", n_embd, " is not a multiple of n_head ", n_head);
  check_activation(activation_function, "gpt2 config");
}

std::vector<ParamDef> gpt2_param_defs(const Gpt2Config& c) {
  c.validate();
  const int64_t e = c.n_embd, f = c.inner();
  const double std = c.initializer_range, proj_std = c.initializer_range / std::sqrt(2.0 * double(c.n_layer));
  std::vector<ParamDef> d;
  d.push_back({"transformer.wte.weight", {c.vocab_size, e}, embedding_role(), InitKind::normal, std});
  d.push_back({"transformer.wpe.weight", {c.n_positions, e}, embedding_role(), InitKind::normal, std});
  auto norm = [&](const std::string& p) {
    d.push_back({p + ".weight", {e}, vector_role(ParamKind::norm), InitKind::ones});
    d.push_back({p + ".bias", {e}, vector_role(ParamKind::norm), InitKind::zeros});
  };
  auto conv = [&](const std::string& p, int64_t in, int64_t out, ParamKind kind, double s) {
    d.push_back({p + ".weight", {in, out}, conv1d_role(kind), InitKind::normal, s});
    d.push_back({p + ".bias", {out}, vector_role(ParamKind::bias), InitKind::zeros});
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::string b = "transformer.h." + std::to_string(l) + ".";
    norm(b + "ln_1");
    // c_attn is [in, q | k | v] in HF files; kept as [in, 3, out] its output features split over
    // the model axis within each of q, k and v (whole heads per rank), not across them.
    d.push_back({b + "attn.c_attn.weight", {e, 3, e}, ParamRole{ParamKind::attention_qkv, 0, 2}, InitKind::normal, std});
    d.back().file_shape = Shape{e, 3 * e};
    d.push_back({b + "attn.c_attn.bias", {3, e}, vector_role(ParamKind::bias), InitKind::zeros});
    d.back().file_shape = Shape{3 * e};
    conv(b + "attn.c_proj", e, e, ParamKind::attention_out, proj_std);
    if (c.add_cross_attention) {
      norm(b + "ln_cross_attn");
      // keys | values from the encoder's states, [in, 2, out] as c_attn's q | k | v.
      d.push_back({b + "crossattention.c_attn.weight", {e, 2, e}, ParamRole{ParamKind::attention_qkv, 0, 2},
                   InitKind::normal, std});
      d.back().file_shape = Shape{e, 2 * e};
      d.push_back({b + "crossattention.c_attn.bias", {2, e}, vector_role(ParamKind::bias), InitKind::zeros});
      d.back().file_shape = Shape{2 * e};
      conv(b + "crossattention.q_attn", e, e, ParamKind::attention_qkv, std);
      conv(b + "crossattention.c_proj", e, e, ParamKind::attention_out, proj_std);
    }
    norm(b + "ln_2");
    conv(b + "mlp.c_fc", e, f, ParamKind::mlp_in, std);
    conv(b + "mlp.c_proj", f, e, ParamKind::mlp_out, proj_std);
  }
  norm("transformer.ln_f");
  return d;
}

ParamRoles gpt2_param_roles(const Gpt2Config& c) { return roles_of(gpt2_param_defs(c)); }

Params gpt2_init(const Gpt2Config& c, const RngKey& key, DType dtype) {
  return init_params(gpt2_param_defs(c), key, dtype);
}

Array gpt2_hidden(const Gpt2Config& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key, bool train,
                  KvCache* cache, Seq2SeqCache* cross) {
  MT_CHECK(cross == nullptr || cache == &cross->self, "[gpt2] a cross-attention cache must hold the self-attention cache");
  c.validate();
  ResolvedDecoderInputs r = resolve_decoder_inputs(in, cache, c.n_positions, "gpt2");
  const int64_t e = c.n_embd, hd = e / c.n_head;
  Array x = add(embedding(p["transformer.wte.weight"], r.ids), embedding(p["transformer.wpe.weight"], r.positions));
  x = dropout(x, c.embd_pdrop, dropout_key.fold_in(0), train);
  const AdapterContext ac{c.lora, dropout_key.fold_in(path_hash("lora")), train};
  const Array mask = r.mask;
  const Array memory = in.encoder_hidden_states;
  MT_CHECK(!c.add_cross_attention || (memory.defined() && memory.ndim() == 3 && memory.dim(0) == r.ids.dim(0) &&
                                      memory.dim(2) == e),
           "[gpt2] a decoder with cross-attention needs encoder_hidden_states (B, S, ", e, ") for input_ids ",
           r.ids.str(), ", got ", memory.defined() ? memory.str() : "none");
  MT_CHECK(c.add_cross_attention || !memory.defined(),
           "[gpt2] encoder_hidden_states given to a model without cross-attention (add_cross_attention is false)");
  const Array memory_mask = padding_mask(in.encoder_attention_mask, "gpt2 encoder_attention_mask");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "transformer.h." + std::to_string(l) + ".";
    const RngKey lk = dropout_key.fold_in(uint64_t(l + 1));
    double scale = c.scale_attn_weights ? 1.0 / std::sqrt(double(hd)) : 1.0;
    if (c.scale_attn_by_inverse_layer_idx) scale /= double(l + 1);
    // Captures by value: a checkpointed block reruns in the backward pass, after this returns.
    // The encoder's states come in as an input, not a capture: under remat the block reruns
    // from its inputs, and the gradient reaches the encoder through them.
    auto block = [c, b, lk, scale, mask, ac, e, train, cache, cross, l, memory_mask](const Params& p,
                                                                                    const std::vector<Array>& inputs) {
      Array x = inputs[0];
      Array h = layer_norm(x, p[b + "ln_1.weight"], p[b + "ln_1.bias"], c.layer_norm_epsilon);
      const Array &w_qkv = p[b + "attn.c_attn.weight"], &b_qkv = p[b + "attn.c_attn.bias"];
      Array down = lora_down(h, p, b + "attn.c_attn", ac);
      AttentionOptions opt{.causal = true, .scale = scale, .dropout_rate = c.attn_pdrop, .dropout_key = lk.fold_in(0),
                           .train = train};
      Array a;
      if (fused_layers() && !h.distributed() && !w_qkv.distributed() && !b_qkv.distributed()) {
        // One GEMM for q | k | v: [in, 3, out] is [in, 3·out] reshaped, and the attention reads
        // the packed product in place (its gradient comes back packed for the one dW and dX GEMM).
        Array qkv = conv1d(h, reshape(w_qkv, {e, 3 * e}), reshape(b_qkv, {3 * e}));
        if (down.defined()) {
          const Array& lb = p[lora_b_path(b + "attn.c_attn")];
          qkv = add(qkv, lora_up(down, reshape(lb, {3 * e, lb.dim(2)}), ac));
        }
        a = cached_packed_projected_attention(cache, size_t(l), qkv, c.n_head, c.n_head, mask, opt);
      } else {
        // The composed reference, and distributed arrays: q, k and v each from their own [in, out]
        // slice of c_attn (a slice along an unsplit dim keeps the tensor-parallel layout); a c_attn
        // adapter shares A(x) and slices its B [3, out, r] the same way.
        auto project = [&](int64_t s) {
          Array w = reshape(slice(w_qkv, 1, s, s + 1), {e, e});
          Array bias = reshape(slice(b_qkv, 0, s, s + 1), {e});
          Array y = conv1d(h, w, bias);
          if (down.defined()) {
            const Array& lb = p[lora_b_path(b + "attn.c_attn")];
            y = add(y, lora_up(down, reshape(slice(lb, 0, s, s + 1), {e, lb.dim(2)}), ac));
          }
          return y;
        };
        a = cached_projected_attention(cache, size_t(l), project(0), project(1), project(2), c.n_head, c.n_head, mask,
                                       opt);
      }
      a = adapted_conv1d(a, p, b + "attn.c_proj", p[b + "attn.c_proj.bias"], ac);
      x = residual_add(x, a, c.resid_pdrop, lk.fold_in(1), train);
      if (c.add_cross_attention) {
        h = layer_norm(x, p[b + "ln_cross_attn.weight"], p[b + "ln_cross_attn.bias"], c.layer_norm_epsilon);
        const std::string ca = b + "crossattention.";
        Array cq = split_heads(adapted_conv1d(h, p, ca + "q_attn", p[ca + "q_attn.bias"], ac), c.n_head);
        // Keys and values from the image's states, with c_attn's adapter (B [2, out, r]) sliced
        // as the self-attention's is.
        Array memory_down;
        auto memory_side = [&](int64_t s) {
          if (s == 0) memory_down = lora_down(inputs[1], p, ca + "c_attn", ac);
          Array w = reshape(slice(p[ca + "c_attn.weight"], 1, s, s + 1), {e, e});
          Array bias = reshape(slice(p[ca + "c_attn.bias"], 0, s, s + 1), {e});
          Array y = conv1d(inputs[1], w, bias);
          if (memory_down.defined()) {
            const Array& lb = p[lora_b_path(ca + "c_attn")];
            y = add(y, lora_up(memory_down, reshape(slice(lb, 0, s, s + 1), {e, lb.dim(2)}), ac));
          }
          return split_heads(y, c.n_head);
        };
        AttentionOptions copt{.causal = false, .scale = scale, .dropout_rate = c.attn_pdrop,
                              .dropout_key = lk.fold_in(3), .train = train};
        // Generating: the encoder side is projected once and kept in the cache.
        auto [ck, cv] = cross ? cross->cross(size_t(l), [&] { return std::pair{memory_side(0), memory_side(1)}; })
                              : std::pair{memory_side(0), memory_side(1)};
        Array ctx = merge_heads(scaled_dot_product_attention(cq, ck, cv, memory_mask, copt));
        ctx = adapted_conv1d(ctx, p, ca + "c_proj", p[ca + "c_proj.bias"], ac);
        x = residual_add(x, ctx, c.resid_pdrop, lk.fold_in(4), train);
      }
      h = layer_norm(x, p[b + "ln_2.weight"], p[b + "ln_2.bias"], c.layer_norm_epsilon);
      Array m = bias_and_activation(adapted_conv1d(h, p, b + "mlp.c_fc", Array(), ac), p[b + "mlp.c_fc.bias"],
                                    c.activation_function);
      m = adapted_conv1d(m, p, b + "mlp.c_proj", p[b + "mlp.c_proj.bias"], ac);
      return residual_add(x, m, c.resid_pdrop, lk.fold_in(2), train);
    };
    x = transformer_block(c.remat, p, b, memory.defined() ? std::vector<Array>{x, memory} : std::vector<Array>{x}, block);
  }
  return layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], c.layer_norm_epsilon);
}

Array gpt2_apply(const Gpt2Config& c, const Params& p, const DecoderInputs& in, const RngKey& dropout_key, bool train,
                 KvCache* cache) {
  return gpt2_head(c, p, keep_last_positions(gpt2_hidden(c, p, in, dropout_key, train, cache), in.logits_to_keep));
}

Array gpt2_head(const Gpt2Config&, const Params& p, const Array& hidden) {
  return matmul(hidden, p["transformer.wte.weight"], false, true);
}

ModelSpec gpt2_model_spec() {
  ModelSpec s;
  s.model_type = "gpt2";
  s.kind = ModelKind::decoder;
  s.display_name = "GPT-2";
  s.lora_targets = R"(\.(attn\.c_attn|attn\.c_proj|crossattention\.(c_attn|q_attn|c_proj)|mlp\.c_fc|mlp\.c_proj)$)";
  s.config_aliases = {{"hidden_size", "n_embd"},
                      {"num_hidden_layers", "n_layer"},
                      {"num_attention_heads", "n_head"},
                      {"max_position_embeddings", "n_positions"}};
  s.base_prefix = "transformer.";
  s.parse_config = [](const nlohmann::json& j, const PretrainedOptions&) -> ModelConfig { return Gpt2Config::from_json(j); };
  s.config_json = [](const ModelConfig& c) { return c.as<Gpt2Config>().to_json(); };
  s.architecture = [](const ModelConfig&) -> std::string { return "GPT2LMHeadModel"; };
  s.param_defs = [](const ModelConfig& c) { return gpt2_param_defs(c.as<Gpt2Config>()); };
  s.ignored_keys = [](const ModelConfig&) {
    return std::vector<std::string>{R"(transformer\.h\.\d+\.attn\.(masked_)?bias)"};
  };
  s.tied_keys = [](const ModelConfig&) {  // GPT-2's head is always the token embedding
    return std::vector<std::pair<std::string, std::string>>{{"transformer.wte.weight", "lm_head.weight"}};
  };
  s.causal_lm = [](const ModelConfig& c, const Params& p) { return gpt2_causal_lm(c.as<Gpt2Config>(), p); };
  s.decoder_hidden = [](const ModelConfig& c, const Params& p, const DecoderInputs& in, const RngKey& key, bool train) {
    return gpt2_hidden(c.as<Gpt2Config>(), p, in, key, train);
  };
  s.decoder_head = [](const ModelConfig& c, const Params& p, const Array& hidden, const RngKey&, bool) {
    return gpt2_head(c.as<Gpt2Config>(), p, hidden);
  };
  s.head_prefixes = {"transformer.wte."};
  s.linear_head = [](const ModelConfig&, const Params&) { return LinearHead{"transformer.wte.weight"}; };
  s.small_config = [](int64_t vocab, int64_t context, int64_t eos) {
    return nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", vocab}, {"n_positions", context}, {"n_embd", 128},
                          {"n_layer", 4},         {"n_head", 4},         {"bos_token_id", eos},  {"eos_token_id", eos}};
  };
  return s;
}

CausalLm gpt2_causal_lm(const Gpt2Config& c, const Params& p) {
  CausalLm lm;
  lm.model_type = "gpt2";
  lm.vocab_size = c.vocab_size;
  lm.max_positions = c.n_positions;
  lm.stop_tokens = {c.eos_token_id};
  lm.forward = [c, p](const DecoderInputs& in, KvCache* cache) { return gpt2_apply(c, p, in, {}, false, cache); };
  return lm;
}

}  // namespace mt::models
