#include "tests/support/tiny_gpt.h"


#include "meshtrain/distributed/sharded_random.h"

namespace mt::testing {

using dist::PartitionSpec;

std::vector<TinyGptParam> tiny_gpt_params(const TinyGptConfig& c) {
  std::vector<TinyGptParam> defs{{"wte", {c.vocab, c.width}, 0.1}, {"wpe", {c.time, c.width}, 0.05}};
  for (int l = 0; l < c.layers; ++l) {
    std::string b = "h." + std::to_string(l) + ".";
    for (const char* n : {"q", "k", "v"}) {
      defs.push_back({b + "attn." + n + ".weight", {c.width, c.width}, 0.1});
      defs.push_back({b + "attn." + n + ".bias", {c.width}, 0.02});
    }
    defs.push_back({b + "attn.proj.weight", {c.width, c.width}, 0.1});
    defs.push_back({b + "attn.proj.bias", {c.width}, 0.02});
    defs.push_back({b + "ln.weight", {c.width}, 0.0});
    defs.push_back({b + "mlp.fc.weight", {c.width, 4 * c.width}, 0.1});
    defs.push_back({b + "mlp.fc.bias", {4 * c.width}, 0.02});
    defs.push_back({b + "mlp.proj.weight", {4 * c.width, c.width}, 0.1});
    defs.push_back({b + "mlp.proj.bias", {c.width}, 0.02});
  }
  defs.push_back({"head.weight", {c.width, c.vocab}, 0.1});
  return defs;
}

PartitionSpec tiny_gpt_spec(const std::string& layout, const TinyGptParam& def) {
  const bool tp = layout == "tp" || layout == "dp_tp", fsdp = layout == "fsdp";
  const std::string& p = def.path;
  if (def.shape.ndim() == 1) return {};
  if (fsdp) return PartitionSpec{"data", ""};
  if (!tp) return {};
  auto ends = [&](const std::string& s) { return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0; };
  if (p == "wte") return PartitionSpec{"model", ""};
  if (p == "head.weight" || ends("q.weight") || ends("k.weight") || ends("v.weight") || ends("fc.weight"))
    return PartitionSpec{"", "model"};
  if (ends("proj.weight")) return PartitionSpec{"model", ""};
  return {};
}

models::ParamRoles tiny_gpt_roles(const TinyGptConfig& c) {
  using models::ParamKind;
  models::ParamRoles roles;
  for (const TinyGptParam& d : tiny_gpt_params(c)) {
    const std::string& p = d.path;
    auto ends = [&](const std::string& s) { return p.size() >= s.size() && p.compare(p.size() - s.size(), s.size(), s) == 0; };
    models::ParamRole r;
    if (d.shape.ndim() == 1) r.kind = ends("bias") ? ParamKind::bias : ParamKind::norm;
    else if (p == "wte" || p == "wpe") r = {ParamKind::embedding, 1, 0};
    else if (p == "head.weight") r = {ParamKind::lm_head, 0, 1};
    else if (ends("q.weight") || ends("k.weight") || ends("v.weight")) r = {ParamKind::attention_qkv, 0, 1};
    else if (ends("attn.proj.weight")) r = {ParamKind::attention_out, 0, 1};
    else if (ends("fc.weight")) r = {ParamKind::mlp_in, 0, 1};
    else if (ends("mlp.proj.weight")) r = {ParamKind::mlp_out, 0, 1};
    roles[p] = r;
  }
  return roles;
}

Params tiny_gpt_init(const TinyGptConfig& c, const std::string& layout, const dist::Mesh* mesh) {
  Params p;
  RngKey key{11, 0};
  uint64_t stream = 0;
  for (const TinyGptParam& d : tiny_gpt_params(c)) {
    RngKey k = key.fold_in(stream++);
    Array v;
    if (d.std == 0.0) v = Array::ones(d.shape, c.dtype);
    else if (mesh) v = dist::random_normal(k, d.shape, dist::Sharding{*mesh, tiny_gpt_spec(layout, d)}, c.dtype, 0.0, d.std, d.path);
    else v = random_normal(k, d.shape, c.dtype, 0.0, d.std);
    p.set(d.path, v);
  }
  return p;
}

Array tiny_gpt_loss(const TinyGptConfig& c, const Params& p, const Array& ids, const Array& labels, uint64_t step) {
  RngKey drop{5, step};
  Array x = add(embedding(p["wte"], ids), p["wpe"]);
  auto heads = [&](const Array& t) { return swap_axes(reshape(t, {c.batch, c.time, c.heads, c.width / c.heads}), 1, 2); };
  for (int l = 0; l < c.layers; ++l) {
    std::string b = "h." + std::to_string(l) + ".";
    Array h = rms_norm(x, p[b + "ln.weight"]);
    auto proj = [&](const char* n) { return add(matmul(h, p[b + "attn." + n + ".weight"]), p[b + "attn." + n + ".bias"]); };
    Array y = scaled_dot_product_attention(heads(proj("q")), heads(proj("k")), heads(proj("v")), Array(), {.causal = true});
    y = reshape(swap_axes(y, 1, 2), {c.batch, c.time, c.width});
    y = add(matmul(y, p[b + "attn.proj.weight"]), p[b + "attn.proj.bias"]);
    x = add(x, dropout(y, c.dropout, drop.fold_in(uint64_t(2 * l)), true));
    Array m = gelu(add(matmul(h, p[b + "mlp.fc.weight"]), p[b + "mlp.fc.bias"]));
    m = add(matmul(m, p[b + "mlp.proj.weight"]), p[b + "mlp.proj.bias"]);
    x = add(x, dropout(m, c.dropout, drop.fold_in(uint64_t(2 * l + 1)), true));
  }
  return cross_entropy(matmul(x, p["head.weight"]), labels);
}

optim::Transform tiny_gpt_optimizer() {
  return optim::adamw(optim::constant_schedule(1e-2), 0.9, 0.999, 1e-5, 0.01);
}

}  // namespace mt::testing
