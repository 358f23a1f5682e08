#include "meshtrain/models/pretrained.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "meshtrain/io/json.h"
#include "meshtrain/io/llama2c.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/io/torch_checkpoint.h"
#include "meshtrain/models/chunked_lm_loss.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/linear_cross_entropy.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::models {

namespace fs = std::filesystem;

namespace {

// Runs `fn`, prefixing any mt::Error with the file it concerns.
template <class F>
decltype(auto) with_source(const std::string& source, F fn) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(detail::concat("[from_pretrained] ", source, ": ", e.what()));
  }
}

const ModelSpec& spec_of_config(const nlohmann::json& j) {
  MT_CHECK(j.is_object(), "[config] config must be a JSON object");
  MT_CHECK(j.contains("model_type") && j["model_type"].is_string(), "[config] missing key 'model_type' (expected ",
           model_types_text(), ")");
  return model_spec(j["model_type"].get<std::string>());
}

bool has_tokenizer_files(const fs::path& dir) {
  for (const char* f : {"tokenizer.json", "vocab.txt", "vocab.json", "encoder.json"})
    if (fs::exists(dir / f)) return true;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".model") return true;
  return false;
}

void finish(PretrainedModel& m, const PretrainedOptions& o) {
  if (o.print_report && (!m.report.complete() || !m.report.renamed.empty()))
    std::cerr << m.report.str(m.architecture, m.source);
}

}  // namespace

std::string LoadReport::str(const std::string& architecture, const std::string& source) const {
  std::ostringstream os;
  if (!unexpected.empty())
    os << "Some weights of the model checkpoint at " << source << " were not used when initializing " << architecture
       << ": [" << detail::join(unexpected) << "]\n";
  if (!missing.empty())
    os << "Some weights of " << architecture << " were not initialized from the model checkpoint at " << source
       << " and are newly initialized: [" << detail::join(missing) << "]\n";
  for (const auto& [from, to] : renamed) os << "Loaded " << to << " of " << architecture << " from " << from << " (" << source << ")\n";
  return os.str();
}

CausalLm PretrainedModel::causal_lm() const {
  const ModelSpec& s = spec();
  MT_CHECK(s.causal_lm != nullptr, "[from_pretrained] ", source, ": model_type '", model_type,
           "' is not a causal language model (no generation)");
  CausalLm lm = s.causal_lm(config, params);
  if (!stop_tokens.empty()) lm.stop_tokens = stop_tokens;
  return lm;
}

namespace {
// The errors for a model without the part a call needs.
void require_seq2seq(bool has, const std::string& source, const std::string& model_type) {
  MT_CHECK(has, "[model] ", source, ": model_type '", model_type, "' is not an encoder-decoder (use ",
           model_types_text(ModelKind::seq2seq), ")");
}
void require_decoder(bool has, const std::string& source, const std::string& model_type) {
  MT_CHECK(has, "[model] ", source, ": model_type '", model_type, "' is not a decoder language model");
}
}  // namespace

Seq2SeqLm PretrainedModel::seq2seq_lm() const { return seq2seq_lm(params); }

Seq2SeqLm PretrainedModel::seq2seq_lm(const Params& p) const {
  const ModelSpec& s = spec();
  require_seq2seq(s.seq2seq_lm != nullptr, source, model_type);
  return s.seq2seq_lm(config, p);
}

Array PretrainedModel::seq2seq_logits(const Params& p, const Seq2SeqInputs& in, const RngKey& dropout_key,
                                      bool train) const {
  const ModelSpec& s = spec();
  require_seq2seq(s.seq2seq_hidden != nullptr, source, model_type);
  return s.decoder_head(config, p, s.seq2seq_hidden(config, p, in, dropout_key, train), dropout_key, train);
}

Array PretrainedModel::seq2seq_loss(const Params& p, const Seq2SeqInputs& in, const Array& labels,
                                    const RngKey& dropout_key, bool train) const {
  require_seq2seq(spec().seq2seq_hidden != nullptr, source, model_type);
  return head_loss(p, spec().seq2seq_hidden(config, p, in, dropout_key, train), labels, dropout_key, train);
}

Array PretrainedModel::decoder_logits(const Params& p, const DecoderInputs& in, const RngKey& dropout_key,
                                      bool train) const {
  const ModelSpec& s = spec();
  require_decoder(s.decoder_hidden != nullptr, source, model_type);
  return s.decoder_head(config, p, keep_last_positions(s.decoder_hidden(config, p, in, dropout_key, train), in.logits_to_keep),
                        dropout_key, train);
}

Array PretrainedModel::decoder_loss(const Params& p, const DecoderInputs& in, const Array& labels,
                                    const RngKey& dropout_key, bool train) const {
  require_decoder(spec().decoder_hidden != nullptr, source, model_type);
  return head_loss(p, spec().decoder_hidden(config, p, in, dropout_key, train), labels, dropout_key, train);
}

Array PretrainedModel::head_loss(const Params& p, const Array& hidden, const Array& labels, const RngKey& dropout_key,
                                 bool train) const {
  const ModelSpec& s = spec();
  const LinearHead linear = s.linear_head ? s.linear_head(config, p) : LinearHead{};
  // A sharded bias keeps the head's own form (the vocabulary-parallel logits, composed).
  if (linear.linear() && (linear.bias.empty() || !p[linear.bias].distributed())) {
    const Array h = linear.hidden_scale == 1.0 ? hidden : mul(hidden, linear.hidden_scale);
    const Array& w = p[linear.weight];
    Array bias;
    if (!linear.bias.empty()) {
      bias = reshape(p[linear.bias], {w.dim(0)});
      if (bias.dtype() != h.dtype()) bias = cast(bias, h.dtype());
    }
    // --remat full promises small chunks of logits; the others take the op's default.
    return linear_cross_entropy(h, w, labels, -100, 0.0, Reduction::mean,
                                config.remat() == Remat::full ? kChunkLogits : kLinearCrossEntropyChunk, bias);
  }
  if (config.remat() != Remat::full) return cross_entropy(s.decoder_head(config, p, hidden, dropout_key, train), labels);
  const Params head_params = head_params_of(s.head_prefixes, p);
  const ModelConfig c = config;
  HeadFn head = [c, dropout_key, train, &s](const Params& hp, const Array& h) {
    return s.decoder_head(c, hp, h, dropout_key, train);
  };
  return chunked_lm_loss(hidden, labels, head, head_params);
}

std::vector<ParamDef> PretrainedModel::param_defs() const {
  std::vector<ParamDef> defs = spec().param_defs(config);
  if (config.lora().enabled())
    for (ParamDef& d : lora_param_defs(defs, config.lora(), spec().lora_targets)) defs.push_back(std::move(d));
  return defs;
}

ParamRoles PretrainedModel::param_roles() const { return roles_of(param_defs()); }

nlohmann::json PretrainedModel::config_json() const { return spec().config_json(config); }

namespace {

bool matches_any(const std::string& key, const std::vector<std::regex>& patterns) {
  for (const auto& re : patterns)
    if (std::regex_match(key, re)) return true;
  return false;
}

std::vector<std::regex> regexes(const std::vector<std::string>& patterns) {
  return std::vector<std::regex>(patterns.begin(), patterns.end());
}

}  // namespace

Params match_checkpoint(const ModelSpec& spec, const ModelConfig& config, Params checkpoint,
                        const PretrainedOptions& o, const std::string& source, LoadReport& report) {
  const std::vector<ParamDef> defs = spec.param_defs(config);
  std::set<std::string> expected;
  for (const ParamDef& d : defs) expected.insert(d.path);
  auto starts = [](const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; };
  // Legacy names (TF-era BERT checkpoints): LayerNorm.gamma / .beta are .weight / .bias.
  {
    Params renamed;
    bool any = false;
    for (const auto& [k, v] : checkpoint) {
      std::string name = k;
      for (const auto& [old_suffix, new_suffix] : {std::pair<std::string, std::string>{".gamma", ".weight"}, {".beta", ".bias"}})
        if (k.size() > old_suffix.size() && k.compare(k.size() - old_suffix.size(), old_suffix.size(), old_suffix) == 0) {
          const std::string candidate = k.substr(0, k.size() - old_suffix.size()) + new_suffix;
          if (expected.count(candidate) || expected.count(spec.base_prefix + candidate)) name = candidate;
        }
      if (name != k) report.renamed.emplace_back(k, name), any = true;
      renamed.set(name, v);
    }
    if (any) checkpoint = std::move(renamed);
  }
  const std::string& base_prefix = spec.base_prefix;
  if (!base_prefix.empty()) {
    bool ckpt_has = false, defs_have = false;
    for (const auto& [k, v] : checkpoint) ckpt_has |= starts(k, base_prefix);
    for (const ParamDef& d : defs) defs_have |= starts(d.path, base_prefix);
    if (!ckpt_has && defs_have) {
      Params renamed;
      for (const auto& [k, v] : checkpoint) renamed.set(expected.count(base_prefix + k) ? base_prefix + k : k, v);
      checkpoint = std::move(renamed);
    }
  }
  if (spec.tied_keys)
    for (const auto& [param, other] : spec.tied_keys(config)) {
      if (!expected.count(param) || !checkpoint.contains(other)) continue;
      if (!checkpoint.contains(param)) {
        checkpoint.set(param, checkpoint[other]);
        report.renamed.emplace_back(other, param);
      } else {
        report.ignored.push_back(other);
      }
      checkpoint.erase(other);
    }
  const auto ignore_re = regexes(spec.ignored_keys ? spec.ignored_keys(config) : std::vector<std::string>{});
  for (const auto& [k, v] : checkpoint) {
    if (expected.count(k)) continue;
    (matches_any(k, ignore_re) ? report.ignored : report.unexpected).push_back(k);
  }
  Params out;
  std::vector<ParamDef> missing;
  for (const ParamDef& d : defs) {
    if (!checkpoint.contains(d.path)) {
      report.missing.push_back(d.path);
      missing.push_back(d);
      continue;
    }
    Array a = checkpoint[d.path];
    if (d.file_shape && a.shape() == *d.file_shape && a.shape() != d.shape) a = reshape(a, d.shape.dims());
    MT_CHECK(a.shape() == d.shape, "[from_pretrained] ", source, ": parameter '", d.path, "' has shape ",
             a.shape().str(), " in the checkpoint, but the model expects ", d.shape.str());
    MT_CHECK(is_floating(a.dtype()), "[from_pretrained] ", source, ": parameter '", d.path, "' has dtype ",
             dtype_name(a.dtype()), ", expected a floating dtype");
    out.set(d.path, a.dtype() == o.dtype ? a : cast(a, o.dtype));
  }
  if (o.new_params != NewParams::all) {
    const auto head_re = regexes(o.new_params == NewParams::heads && spec.head_keys ? spec.head_keys(config)
                                                                                    : std::vector<std::string>{});
    std::vector<std::string> refused;
    for (const ParamDef& d : missing)
      if (!matches_any(d.path, head_re)) refused.push_back(d.path);
    MT_CHECK(refused.empty(), "[from_pretrained] ", source, ": the checkpoint has no weights for ", refused.size(), " of the ",
             defs.size(), " parameters of ", spec.architecture(config), ": [", detail::join(refused),
             "]; a model does not run on random weights unless asked: pass --allow-new-heads "
             "(PretrainedOptions::new_params) to initialize them");
  }
  if (!missing.empty()) {
    Params init = init_params(missing, o.init_key, o.dtype);
    for (const auto& [k, v] : init) out.set(k, v);
    // Keep the defs' order (the checkpoint order is the defs' order too).
    Params ordered;
    for (const ParamDef& d : defs) ordered.set(d.path, out[d.path]);
    out = std::move(ordered);
  }
  return out;
}

namespace {

// `config_source` names where the config came from in errors (a config.json, a .bin header).
PretrainedModel build_model(const nlohmann::json& config, Params checkpoint, const std::string& source,
                            const std::string& config_source, const PretrainedOptions& o) {
  PretrainedModel m;
  m.source = source;
  const ModelSpec& spec = with_source(config_source, [&]() -> const ModelSpec& { return spec_of_config(config); });
  m.model_type = spec.model_type;
  m.config = with_source(config_source, [&] { return spec.parse_config(config, o); });
  m.architecture = spec.architecture(m.config);
  m.params = match_checkpoint(spec, m.config, std::move(checkpoint), o, source, m.report);
  return m;
}

}  // namespace

PretrainedModel model_from_checkpoint(const nlohmann::json& config, Params checkpoint, const std::string& source,
                                      const PretrainedOptions& o) {
  return build_model(config, std::move(checkpoint), source, source + " config", o);
}

PretrainedModel init_model(const nlohmann::json& config, const PretrainedOptions& options) {
  PretrainedOptions o = options;
  o.new_params = NewParams::all;
  PretrainedModel m = build_model(config, {}, "init", "config", o);
  m.report = {};  // every parameter is new by design: nothing to report
  return m;
}

PretrainedModel load_llama2c_model(const std::string& path, const PretrainedOptions& o) {
  io::Llama2cCheckpoint ck = io::load_llama2c(path);
  nlohmann::json j = io::llama2c_hf_config(ck.config);
  PretrainedModel m = build_model(j, std::move(ck.params), path, path + " header", o);
  // llama2.c's run.c ends a sample at BOS (1): every story in its training data starts with it.
  m.stop_tokens = {1};
  finish(m, o);
  return m;
}

PretrainedModel from_pretrained(const std::string& path, const PretrainedOptions& o) {
  MT_CHECK(fs::exists(path), "[from_pretrained] ", path, ": no such file or directory");
  if (!fs::is_directory(path)) {
    MT_CHECK(fs::path(path).extension() == ".bin", "[from_pretrained] ", path,
             ": expected a model directory (config.json + safetensors) or a llama2.c .bin checkpoint");
    return load_llama2c_model(path, o);
  }
  const fs::path dir(path);
  MT_CHECK(fs::exists(dir / "config.json"), "[from_pretrained] ", path, ": no config.json in the model directory");
  nlohmann::json config = io::read_json_file((dir / "config.json").string());
  const bool safetensors = fs::exists(dir / "model.safetensors") || fs::exists(dir / "model.safetensors.index.json");
  MT_CHECK(safetensors || fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json"),
           "[from_pretrained] ", path,
           ": no weights (looked for model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
           "pytorch_model.bin.index.json)");
  // safetensors first, as transformers prefers it when a folder has both.
  Params checkpoint = safetensors ? io::load_safetensors(path) : io::load_torch_checkpoint_dir(path);
  PretrainedModel m = build_model(config, std::move(checkpoint), path, (dir / "config.json").string(), o);
  if (o.load_tokenizer && has_tokenizer_files(dir)) m.tokenizer = tokenizers::load_tokenizer(path);
  finish(m, o);
  return m;
}

}  // namespace mt::models
