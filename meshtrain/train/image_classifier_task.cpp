#include "meshtrain/train/image_classifier_task.h"

#include "meshtrain/data/image_decode.h"
#include "meshtrain/models/vit.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/reduce.h"

namespace mt::train {
namespace {

Array classifier_logits(const models::PretrainedModel& model, const Params& p, const Array& pixels, const RngKey& key,
                        bool training) {
  const auto& c = model.config.as<models::VitConfig>();
  MT_CHECK(c.head == models::VitHead::image_classification, "[image classifier] ", model.source,
           " is a ViTModel without a classifier (architectures: ViTForImageClassification)");
  return models::vit_apply(c, p, pixels, key, training).logits;
}

}  // namespace

std::vector<data::Example> image_classifier_examples(const data::ImageFolder& folder, data::BadImages policy,
                                                     size_t* skipped) {
  std::vector<data::Example> rows;
  for (const data::CaptionedImage& image : data::check_images(folder.images, policy, skipped))
    rows.push_back({{"image", image.image}, {"label", folder.label_of(image)}});
  return rows;
}

CollateFn image_classifier_collate(const data::ImageProcessorConfig& processor) {
  return [processor](const std::vector<data::Example>& rows) {
    std::vector<std::string> paths;
    std::vector<int64_t> labels;
    for (const auto& r : rows) {
      paths.push_back(r.str("image"));
      labels.push_back(r.contains("label") ? r.as_int("label") : -100);
    }
    return Batch{{"pixel_values", data::pixel_values(data::read_images(paths), processor)},
                 {"labels", Array::from_vector(labels, {int64_t(rows.size())})}};
  };
}

LossFn image_classifier_loss_fn(std::shared_ptr<const models::PretrainedModel> model) {
  return [model](const Params& p, const Batch& b, const RngKey& key, bool training) {
    return cross_entropy(classifier_logits(*model, p, b["pixel_values"], key, training), b["labels"]);
  };
}

PredFn image_classifier_predict_fn(std::shared_ptr<const models::PretrainedModel> model) {
  return [model](const Params& p, const Batch& b) {
    return Batch{{"prediction", argmax(classifier_logits(*model, p, b["pixel_values"], RngKey{}, false), -1)}};
  };
}

}  // namespace mt::train
