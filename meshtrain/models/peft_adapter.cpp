#include "meshtrain/models/peft_adapter.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "meshtrain/distributed/spmd.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kPeftPrefix = "base_model.model.";

std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string(".^$|()[]{}*+?\\").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// The last `n` dot-separated components of a module path ("attn.c_proj" for n = 2).
std::string tail_components(const std::string& path, int n) {
  size_t pos = path.size();
  for (int i = 0; i < n; ++i) {
    size_t dot = pos == 0 ? std::string::npos : path.rfind('.', pos - 1);
    if (dot == std::string::npos) return path;
    pos = dot;
  }
  return path.substr(pos + 1);
}

// PEFT's list form of target_modules: a module matches a name when it is the name or ends
// with "." + name.
bool suffix_match(const std::string& module, const std::set<std::string>& names) {
  for (const std::string& n : names)
    if (module == n || (module.size() > n.size() && module.compare(module.size() - n.size(), n.size(), n) == 0 &&
                        module[module.size() - n.size() - 1] == '.'))
      return true;
  return false;
}

// target_modules as PEFT writes it: the shortest list of module-name suffixes that picks
// exactly the adapted modules, or (when no list does) a regex PEFT full-matches.
json target_modules_json(const std::vector<ParamDef>& base_defs, const LoraOptions& o) {
  const std::vector<LoraModule> all = lora_candidates(base_defs);
  std::set<std::string> targeted;
  for (const LoraModule& m : lora_targets(base_defs, o, "")) targeted.insert(m.path);
  for (int n = 1; n <= 3; ++n) {
    std::set<std::string> names;
    for (const std::string& t : targeted) names.insert(tail_components(t, n));
    bool exact = true;
    for (const LoraModule& m : all) exact = exact && suffix_match(m.path, names) == (targeted.count(m.path) > 0);
    if (exact) return json(std::vector<std::string>(names.begin(), names.end()));
  }
  std::string regex = ".*(?:";
  regex.append(o.targets).append(").*");
  return regex;
}

// PEFT's fan_in_fan_out: the adapted weights are stored [in, out] (HF's Conv1D, GPT-2), so PEFT
// transposes B·A when merging. Read from the weights' roles, not from the model's name.
bool adapted_weights_are_in_out(const std::vector<ParamDef>& base_defs, const LoraOptions& o) {
  for (const LoraModule& m : lora_targets(base_defs, o, ""))
    if (m.role.in_dim == 0) return true;
  return false;
}

// target_modules back to our targets regex (searched in module paths).
std::string targets_from_json(const json& t, const std::string& where) {
  std::string regex = "^(?:";
  if (t.is_string()) return regex.append(t.get<std::string>()).append(")$");
  MT_CHECK(t.is_array() && !t.empty(), "[adapter] ", where, ": target_modules must be a string or a non-empty list");
  std::string alternatives;
  for (const json& n : t) {
    MT_CHECK(n.is_string(), "[adapter] ", where, ": target_modules holds a non-string ", n.dump());
    alternatives += (alternatives.empty() ? "" : "|") + regex_escape(n.get<std::string>());
  }
  regex = "(^|\\.)(?:";
  return regex.append(alternatives).append(")$");
}

template <class T>
T field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  MT_CHECK(it != j.end() && !it->is_null(), "[adapter] ", where, ": missing '", key, "'");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error("[adapter] " + where + ": '" + key + "' has the wrong type (" + it->type_name() + ")");
  }
}

// The dtype adapters take: the model's (first floating) parameters'.
DType float_dtype(const Params& params) {
  for (const auto& [path, v] : params)
    if (is_floating(v.dtype())) return v.dtype();
  return DType::f32;
}

// The model's parameters inside a module PEFT's modules_to_save names pick.
std::vector<std::string> saved_module_params(const Params& params, const std::set<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& [path, v] : params)
    for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', dot + 1))
      if (suffix_match(path.substr(0, dot), names)) {
        out.push_back(path);
        break;
      }
  return out;
}

std::set<std::string> modules_to_save_of(const json& c, const std::string& where) {
  std::set<std::string> names;
  auto it = c.find("modules_to_save");
  if (it == c.end() || it->is_null()) return names;
  MT_CHECK(it->is_array(), "[adapter] ", where, ": modules_to_save must be a list or null");
  for (const json& n : *it) {
    MT_CHECK(n.is_string(), "[adapter] ", where, ": modules_to_save holds a non-string ", n.dump());
    names.insert(n.get<std::string>());
  }
  return names;
}

const std::string kClassifierKey = kPeftPrefix + "classifier.weight";

}  // namespace

std::string lora_parameter_pattern() { return R"(.*\.lora_[AB]\.weight)"; }

void add_lora(PretrainedModel& model, LoraOptions options, const RngKey& key) {
  MT_CHECK(!model.config.lora().enabled(), "[lora] ", model.source, " already carries LoRA adapters");
  if (options.targets.empty()) options.targets = model.spec().lora_targets;
  const std::vector<ParamDef> base = model.param_defs();
  const std::vector<ParamDef> defs = lora_param_defs(base, options, model.spec().lora_targets);
  for (const auto& [path, value] : init_params(defs, key, float_dtype(model.params))) model.params.set(path, value);
  model.config = model.config.with_lora(options);
}

PretrainedModel merge_lora(const PretrainedModel& model) {
  PretrainedModel merged = model;
  const LoraOptions lora = model.config.lora();
  merged.config = model.config.with_lora(LoraOptions{});
  if (!lora.enabled()) return merged;
  Params host;
  for (const auto& [path, a] : model.params) host.set(path, dist::to_host(a));
  merged.params = merge_lora(host, merged.param_defs(), lora);
  return merged;
}

bool is_adapter_dir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / "adapter_config.json"); }

void save_adapter(const PretrainedModel& model, const std::string& dir, const std::string& base_model,
                  const std::vector<std::string>& modules_to_save) {
  const LoraOptions& o = model.config.lora();
  MT_CHECK(o.enabled(), "[adapter] the model has no LoRA adapters to save to ", dir);
  PretrainedModel base = model;
  base.config = model.config.with_lora(LoraOptions{});
  const std::vector<ParamDef> base_defs = base.param_defs();
  Params tensors;
  for (const ParamDef& d : lora_param_defs(base_defs, o, model.spec().lora_targets)) {
    Array a = dist::to_host(model.params[d.path]);
    if (d.file_shape) a = reshape(a, d.file_shape->dims());
    tensors.set(kPeftPrefix + d.path, a);
  }
  const std::set<std::string> saved(modules_to_save.begin(), modules_to_save.end());
  const std::vector<std::string> saved_params = saved_module_params(model.params, saved);
  MT_CHECK(saved.empty() || !saved_params.empty(), "[adapter] modules_to_save [", detail::join(modules_to_save),
           "] names no module of ", model.source);
  for (const std::string& path : saved_params) tensors.set(kPeftPrefix + path, dist::to_host(model.params[path]));
  const ModelKind kind = model.spec().kind;
  json config = {
      {"peft_type", "LORA"},
      {"task_type", kind == ModelKind::decoder   ? json("CAUSAL_LM")
                    : kind == ModelKind::seq2seq ? json("SEQ_2_SEQ_LM")
                    : model.architecture == "BertForSequenceClassification" ? json("SEQ_CLS")
                                                                            : json(nullptr)},
      {"base_model_name_or_path", base_model},
      {"r", o.rank},
      {"lora_alpha", o.alpha},
      {"lora_dropout", o.dropout},
      {"use_rslora", o.use_rslora},
      {"target_modules", target_modules_json(base_defs, o)},
      {"fan_in_fan_out", adapted_weights_are_in_out(base_defs, o)},
      {"bias", "none"},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", saved.empty() ? json(nullptr) : json(modules_to_save)},
  };
  fs::create_directories(dir);
  io::save_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  const fs::path cfg = fs::path(dir) / "adapter_config.json", tmp = cfg.string() + ".tmp";
  {
    std::ofstream out(tmp);
    MT_CHECK(out.good(), "[adapter] cannot write ", tmp.string());
    out << config.dump(2) << "\n";
  }
  fs::rename(tmp, cfg);
}

void adapter_base_options(const std::string& dir, PretrainedOptions& options) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const json c = io::read_json_file(cfg_path);
  if (!c.is_object() || !c.value("task_type", json()).is_string() || c["task_type"] != "SEQ_CLS") return;
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  // The header alone says the head's size; load_adapter reads the tensors.
  const io::SafetensorsFile file = io::SafetensorsFile::open(st_path);
  MT_CHECK(file.contains(kClassifierKey) && file.info(kClassifierKey).shape.ndim() == 2, "[adapter] ", st_path,
           ": a sequence-classification adapter needs its classifier '", kClassifierKey, "' [num_labels, hidden]");
  options.bert_head = BertHead::sequence_classification;
  options.num_labels = file.info(kClassifierKey).shape.dim(0);
  // The head the base lacks comes from the adapter (load_adapter checks it is there).
  if (options.new_params == NewParams::none) options.new_params = NewParams::heads;
}

std::vector<std::string> load_adapter(PretrainedModel& model, const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  MT_CHECK(fs::is_regular_file(cfg_path), "[adapter] ", dir, " is not a PEFT adapter directory (no adapter_config.json)");
  MT_CHECK(fs::is_regular_file(st_path), "[adapter] ", dir, " has no adapter_model.safetensors");
  MT_CHECK(!model.config.lora().enabled(), "[adapter] ", model.source, " already carries LoRA adapters");
  const json c = io::read_json_file(cfg_path);
  MT_CHECK(c.is_object(), "[adapter] ", cfg_path, ": not a JSON object");
  const std::string peft_type = field<std::string>(c, "peft_type", cfg_path);
  MT_CHECK(peft_type == "LORA", "[adapter] ", cfg_path, ": peft_type '", peft_type, "' is not supported (only LORA)");
  LoraOptions o;
  o.rank = field<int64_t>(c, "r", cfg_path);
  o.alpha = field<double>(c, "lora_alpha", cfg_path);
  o.dropout = c.value("lora_dropout", 0.0);
  o.use_rslora = c.contains("use_rslora") && c["use_rslora"].is_boolean() && c["use_rslora"].get<bool>();
  MT_CHECK(c.contains("target_modules"), "[adapter] ", cfg_path, ": missing 'target_modules'");
  o.targets = targets_from_json(c["target_modules"], cfg_path);
  const std::string base_name = c.value("base_model_name_or_path", std::string("(unnamed)"));
  auto mismatch = [&](const std::string& what) {
    return Error("[adapter] " + dir + " (for base '" + base_name + "') does not fit " + model.source + " (" +
                 model.architecture + "): " + what);
  };

  Params file = io::load_safetensors(st_path);
  std::set<std::string> unused;
  for (const auto& [key, v] : file) unused.insert(key);
  std::vector<ParamDef> defs;
  try {
    defs = lora_param_defs(model.param_defs(), o, "");
  } catch (const Error& e) {
    throw mismatch(e.what());
  }
  const DType dtype = float_dtype(model.params);
  Params adapters;
  for (const ParamDef& d : defs) {
    const std::string key = kPeftPrefix + d.path;
    if (!file.contains(key)) throw mismatch("no tensor '" + key + "' in " + st_path + " for targeted module");
    Array a = file[key];
    const Shape want = d.file_shape ? *d.file_shape : d.shape;
    if (a.shape() != want)
      throw mismatch("'" + key + "' has shape " + a.shape().str() + ", the model needs " + want.str());
    if (d.file_shape) a = reshape(a, d.shape.dims());
    adapters.set(d.path, a.dtype() == dtype ? a : cast(a, dtype));
    unused.erase(key);
  }
  // Modules trained in full beside the adapters (a task head) replace the model's.
  const std::set<std::string> saved = modules_to_save_of(c, cfg_path);
  std::vector<std::string> replaced;
  for (const std::string& path : saved_module_params(model.params, saved)) {
    const std::string key = kPeftPrefix + path;
    if (!file.contains(key)) continue;
    const Array& a = file[key];
    if (a.shape() != model.params[path].shape())
      throw mismatch("'" + key + "' has shape " + a.shape().str() + ", the model needs " + model.params[path].shape().str());
    adapters.set(path, a.dtype() == dtype ? a : cast(a, dtype));
    unused.erase(key);
    replaced.push_back(path);
  }
  if (c.value("task_type", json()).is_string() && c["task_type"] == "SEQ_CLS" && !file.contains(kClassifierKey))
    throw mismatch("a sequence-classification adapter without its trained classifier ('" + kClassifierKey + "')");
  if (!unused.empty())
    throw mismatch("'" + *unused.begin() + "' names no adapted module of this model (" + std::to_string(unused.size()) +
                   " such keys)");
  for (const auto& [path, v] : adapters) model.params.set(path, v);
  model.config = model.config.with_lora(o);
  return replaced;
}

}  // namespace mt::models
