#include "meshtrain/train/model_image_processor.h"

#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
#include "meshtrain/train/checkpoint_model.h"

namespace mt::train {

namespace fs = std::filesystem;

data::ImageProcessorConfig model_image_processor(const std::string& model_path, int64_t image_size) {
  data::ImageProcessorConfig processor;
  processor.height = processor.width = image_size;
  std::string source = "the default";
  if (!model_path.empty() && is_checkpoint_path(model_path)) {
    const std::string meta = (fs::path(resolve_checkpoint(model_path)) / "meta.json").string();
    const nlohmann::json extra = io::read_json_file(meta).value("extra", nlohmann::json::object());
    if (extra.contains(kImageProcessorKey)) {
      processor = data::ImageProcessorConfig::from_json(extra[kImageProcessorKey], meta);
      source = meta;
    }
  } else if (!model_path.empty() && fs::exists(fs::path(model_path) / "preprocessor_config.json")) {
    processor = data::load_image_processor_config(model_path);
    source = (fs::path(model_path) / "preprocessor_config.json").string();
  }
  MT_CHECK(processor.do_resize && processor.height == image_size && processor.width == image_size,
           "[image processor] ", source, " resizes to ", processor.width, "x", processor.height,
           " but the model takes ", image_size, "x", image_size);
  return processor;
}

}  // namespace mt::train
