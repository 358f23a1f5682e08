#pragma once
// An image classifier's (ViTForImageClassification) pipeline functions: collate decodes a
// batch's images in parallel on the loader's thread into pixel_values and takes their labels;
// the loss is the cross-entropy of the logits; predict gives each image's most likely class.
// `meshtrain image-classify`, `eval` and `generate --image` run them.
#include <memory>

#include "meshtrain/data/image_folder.h"
#include "meshtrain/data/image_processor.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/train/predictor.h"
#include "meshtrain/train/trainer.h"

namespace mt::train {

// Rows {"image": path, "label": class index} of a folder's images, each decoded first (in
// parallel): an unreadable one stops with its name, or under BadImages::skip is dropped and
// counted in *skipped.
std::vector<data::Example> image_classifier_examples(const data::ImageFolder& folder, data::BadImages policy,
                                                     size_t* skipped = nullptr);
// Rows {"image": path, "label": class index} -> {pixel_values (B, 3, H, W) f32, labels (B) i64}.
CollateFn image_classifier_collate(const data::ImageProcessorConfig& processor);
LossFn image_classifier_loss_fn(std::shared_ptr<const models::PretrainedModel> model);
// {"prediction": (B) i64}, the argmax of the logits.
PredFn image_classifier_predict_fn(std::shared_ptr<const models::PretrainedModel> model);

}  // namespace mt::train
