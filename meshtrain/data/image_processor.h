#pragma once
// Hugging Face's ViTImageProcessor as arithmetic: resize to the configured size with its PIL
// filter (data/image_resize.h), rescale (by 1/255), normalize by the config's mean and std,
// channels first. Read from preprocessor_config.json (the keys and defaults of transformers'
// ViTImageProcessor; "size" as {"height", "width"} or one number). The float steps follow
// transformers': the rescale multiplies in double and rounds to f32, the normalization is f32.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/core/array.h"
#include "meshtrain/data/image.h"
#include "meshtrain/data/image_resize.h"

namespace mt::data {

struct ImageProcessorConfig {
  bool do_resize = true;
  int64_t height = 224, width = 224;
  Resample resample = Resample::bilinear;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<float, 3> image_mean{0.5f, 0.5f, 0.5f}, image_std{0.5f, 0.5f, 0.5f};

  // From preprocessor_config.json's object; `source` names it in errors.
  static ImageProcessorConfig from_json(const nlohmann::json& j, const std::string& source);
  nlohmann::json to_json() const;
};

// A model folder's preprocessor_config.json (a path to the file or to its folder).
ImageProcessorConfig load_image_processor_config(const std::string& path);
// Writes it as a model folder's preprocessor_config.json (atomically), beside the weights.
void save_image_processor_config(const ImageProcessorConfig& config, const std::string& model_dir);

// One image as (3, height, width) f32 values, written to `out` (3 * H * W floats).
void preprocess_image(const Image& image, const ImageProcessorConfig& config, float* out);
// A batch as pixel_values (N, 3, H, W) f32. Without do_resize the images must share a size.
Array pixel_values(const std::vector<Image>& images, const ImageProcessorConfig& config);

}  // namespace mt::data
