#pragma once
// Which image preprocessing a captioner expects, wherever it was saved: a meshtrain
// checkpoint (or run directory) keeps it in its meta.json ("image_processor", written by
// `meshtrain caption`), a Hugging Face folder in preprocessor_config.json; a model with
// neither gets ViTImageProcessor's defaults at its encoder's image size. The size must be the
// encoder's, or the error says both.
#include <string>

#include "meshtrain/data/image_processor.h"
#include "meshtrain/models/vision_encoder_decoder.h"

namespace mt::train {

// The meta.json key under a checkpoint's extra state.
inline constexpr const char* kImageProcessorKey = "image_processor";

data::ImageProcessorConfig captioner_image_processor(const std::string& model_path,
                                                     const models::VisionEncoderDecoderConfig& c);

}  // namespace mt::train
