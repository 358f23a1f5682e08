#include "meshtrain/train/caption_task.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/data/image_decode.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/vision_encoder_decoder.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/caption_metrics.h"
#include "meshtrain/train/row_padding.h"
#include "meshtrain/train/seq2seq_task.h"

namespace mt::train {

std::vector<data::Example> caption_train_examples(const std::vector<data::CaptionedImage>& images,
                                                  const tokenizers::Tokenizer& tok, const CaptionTokens& t) {
  std::vector<data::Example> rows;
  for (const data::CaptionedImage& im : images)
    for (const std::string& caption : im.captions)
      rows.push_back({{"image", im.image}, {"labels", seq2seq_ids(tok, caption, t.max_target_length, t.eos_id)}});
  return rows;
}

std::vector<data::Example> caption_eval_examples(const std::vector<data::CaptionedImage>& images) {
  std::vector<data::Example> rows;
  for (size_t i = 0; i < images.size(); ++i) rows.push_back({{"image", images[i].image}, {"index", int64_t(i)}});
  return rows;
}

CollateFn caption_collate(const data::ImageProcessorConfig& processor, const CaptionTokens& t) {
  return [processor, t](const std::vector<data::Example>& rows) {
    MT_CHECK(!rows.empty(), "[caption] empty batch");
    // A batch's images decode in parallel on the loader's thread, beside the training step.
    std::vector<std::string> paths;
    for (const auto& r : rows) paths.push_back(r.str("image"));
    Batch out;
    out.set("pixel_values", data::pixel_values(data::read_images(paths), processor));
    if (!rows.front().contains("labels")) return out;
    // Rows are built max_target_length wide, then (t.pad_multiple > 0) cut after the batch's
    // last caption token; data ranks pad their slices back to one width (batch_shapes.h).
    const size_t n = size_t(t.max_target_length);
    for (const auto& r : rows)
      MT_CHECK(r.tokens("labels").size() <= n, "[caption] a caption of ", r.tokens("labels").size(),
               " tokens exceeds max_target_length ", n);
    const int64_t b = int64_t(rows.size());
    std::vector<int64_t> labels(size_t(b) * n, -100);
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& ids = rows[i].tokens("labels");
      std::copy(ids.begin(), ids.end(), labels.begin() + long(i * n));
    }
    int64_t width = int64_t(n);
    if (t.pad_multiple > 0) {
      width = columns_in_use(labels, b, width, -100, t.pad_multiple);
      keep_columns(labels, b, int64_t(n), width);
    }
    Array label_array = Array::from_vector(labels, Shape{b, width});
    out.set("decoder_input_ids", models::shift_right(labels, b, width, t.decoder_start_id, t.pad_id));
    out.set("labels", label_array);
    return out;
  };
}

std::vector<PaddedFields> caption_padded_fields(const CaptionTokens& t) {
  return {{{"decoder_input_ids", double(t.pad_id)}, {"labels", -100.0}}};
}

LossFn caption_loss_fn(std::shared_ptr<const models::PretrainedModel> model) {
  return [model](const Params& p, const Batch& b, const RngKey& key, bool train) {
    const auto& c = model->config.as<models::VisionEncoderDecoderConfig>();
    return cross_entropy(
        models::vision_encoder_decoder_logits(c, p, b["pixel_values"], b["decoder_input_ids"], Array(), key, train),
        b["labels"]);
  };
}

PredFn caption_predict_fn(std::shared_ptr<const models::PretrainedModel> model, models::GenerationConfig g) {
  return [model, g](const Params& p, const Batch& b) {
    const auto& c = model->config.as<models::VisionEncoderDecoderConfig>();
    // The whole global batch on every rank: the model's collectives need all ranks in step.
    const Array pixels = dist::to_host(b["pixel_values"]);
    Batch o;
    o.set("tokens", pack_token_rows(models::generate_captions(c, p, pixels, g).tokens, g.max_new_tokens));
    return o;
  };
}

Predictor<std::string> caption_predictor(Deployer& deployer, std::shared_ptr<const models::PretrainedModel> model,
                                         const data::ImageProcessorConfig& processor, const CaptionTokens& t,
                                         int64_t num_beams, std::shared_ptr<const tokenizers::Tokenizer> tok) {
  MT_CHECK(num_beams >= 1, "[caption] the beam count must be >= 1, got ", num_beams);
  models::GenerationConfig g;
  g.max_new_tokens = t.max_target_length;
  g.num_beams = num_beams;
  g.pad_token_id = t.pad_id;
  return Predictor<std::string>(deployer, caption_collate(processor, t), caption_predict_fn(std::move(model), g),
                                [tok, t](const Batch& host) {
                                  std::vector<std::string> texts;
                                  for (const auto& ids : unpack_token_rows(host["tokens"]))
                                    texts.push_back(caption_text(*tok, ids, t.eos_id, t.pad_id));
                                  return texts;
                                });
}

}  // namespace mt::train
