#pragma once
// Which image preprocessing an image model (a captioner, a ViT classifier) expects, wherever
// it was saved: a meshtrain checkpoint (or run directory) keeps it in its meta.json
// ("image_processor", written by the training commands), a Hugging Face folder in
// preprocessor_config.json; a model with neither gets ViTImageProcessor's defaults at its
// image size. The size must be the model's, or the error says both.
#include <cstdint>
#include <string>

#include "meshtrain/data/image_processor.h"

namespace mt::train {

// The meta.json key under a checkpoint's extra state.
inline constexpr const char* kImageProcessorKey = "image_processor";

data::ImageProcessorConfig model_image_processor(const std::string& model_path, int64_t image_size);

}  // namespace mt::train
