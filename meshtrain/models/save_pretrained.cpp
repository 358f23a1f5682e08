// save_pretrained: a model as a Hugging Face folder, written one tensor at a time.
#include <filesystem>
#include <map>

#include "meshtrain/io/mapped_file.h"
#include "meshtrain/io/safetensors_writer.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

namespace fs = std::filesystem;

void save_pretrained(const PretrainedModel& model, const std::string& dir, DType dtype) {
  if (model.config.lora().enabled()) {  // the saved model computes what this one does
    MT_CHECK(is_floating(dtype), "[save_pretrained] ", dir, ": the saved dtype must be floating, got ", dtype_name(dtype));
    save_pretrained(merge_lora(model), dir, dtype);
    return;
  }
  save_pretrained_streamed(model, model.params, [&](const std::string& path) { return model.params.at(path); }, dir,
                           dtype, true);
}

void save_pretrained_streamed(const PretrainedModel& model, const Params& params, const TensorFetch& fetch,
                              const std::string& dir, DType dtype, bool write) {
  MT_CHECK(is_floating(dtype), "[save_pretrained] ", dir, ": the saved dtype must be floating, got ", dtype_name(dtype));
  MT_CHECK(!model.config.lora().enabled(), "[save_pretrained] ", dir,
           ": a LoRA model is saved with its adapters merged into a copy of its weights (save_pretrained)");
  const ModelSpec& spec = model.spec();
  // The layout transformers' class computes with (to_hf_layout treats each parameter on its
  // own, so it is applied to one at a time).
  const ModelConfig config = spec.to_hf_layout ? spec.to_hf_layout(model.config, Params{}).first : model.config;
  // Parameters the model keeps in another shape go back to their Hugging Face shape.
  std::map<std::string, Shape> file_shapes;
  for (const ParamDef& d : spec.param_defs(model.config))
    if (d.file_shape) file_shapes.emplace(d.path, *d.file_shape);
  std::vector<io::TensorHeader> headers;
  for (const auto& [path, a] : params) {
    const auto it = file_shapes.find(path);
    headers.push_back({path, is_floating(a.dtype()) ? dtype : a.dtype(), it != file_shapes.end() ? it->second : a.shape()});
  }
  auto saved = [&](const std::string& path, Array a) {
    if (spec.to_hf_layout) {
      Params one;
      one.set(path, std::move(a));
      a = spec.to_hf_layout(model.config, std::move(one)).second.at(path);
    }
    if (const auto it = file_shapes.find(path); it != file_shapes.end()) a = reshape(a, it->second.dims());
    if (is_floating(a.dtype()) && a.dtype() != dtype) a = cast(a, dtype);
    return a;
  };
  const std::vector<size_t> order = io::safetensors_data_order(headers);
  std::unique_ptr<io::SafetensorsWriter> writer;
  if (write) {
    fs::create_directories(dir);
    writer = std::make_unique<io::SafetensorsWriter>((fs::path(dir) / "model.safetensors").string(), headers,
                                                     std::map<std::string, std::string>{{"format", "pt"}});
  }
  // In the file's order, so each tensor is fetched, converted, written and freed before the
  // next (fetch is collective when the parameters are sharded: every process runs this loop).
  for (size_t i : order) {
    Array a = fetch(headers[i].name);
    if (writer) writer->write(saved(headers[i].name, std::move(a)));
  }
  if (!writer) return;
  writer->commit();
  // config.json last, each file written atomically: a folder never holds a config without its
  // weights, even when the process is killed while saving.
  nlohmann::json j = spec.config_json(config);
  j["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  io::write_file_atomic((fs::path(dir) / "config.json").string(), j.dump(2) + "\n");
}

}  // namespace mt::models
