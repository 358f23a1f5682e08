#pragma once
// The image-captioning pipeline's three functions (the Redco paper's Figure 4) for a
// VisionEncoderDecoderModel: collate turns rows naming an image and its caption into
// pixel_values (decoded and preprocessed here, on the loader's thread, the images of a batch in
// parallel), decoder_input_ids and labels; the loss is the teacher-forced cross-entropy; predict
// is beam search (or greedy) over the images, the Predictor's pred_fn.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/caption_rows.h"
#include "meshtrain/data/example.h"
#include "meshtrain/data/image_processor.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/train/batch_shapes.h"
#include "meshtrain/train/predictor.h"
#include "meshtrain/train/trainer.h"

namespace mt::tokenizers {
class Tokenizer;
}

namespace mt::train {

struct CaptionTokens {
  int64_t pad_id = 0, eos_id = 0, decoder_start_id = 0;
  int64_t max_target_length = 32;  // caption tokens, the end token included
  // 0: every batch max_target_length wide; otherwise cut after the batch's last caption token,
  // rounded up to this multiple (train/row_padding.h: exact in the causal decoder).
  int64_t pad_multiple = 0;
};

// Training rows: one {"image": path, "labels": caption ids ending with eos} per caption.
std::vector<data::Example> caption_train_examples(const std::vector<data::CaptionedImage>& images,
                                                  const tokenizers::Tokenizer& tok, const CaptionTokens& t);
// Evaluation rows: one {"image": path, "index": i} per image (its references stay beside).
std::vector<data::Example> caption_eval_examples(const std::vector<data::CaptionedImage>& images);

// Batch {pixel_values (B, C, H, W) f32} plus, for training rows, {decoder_input_ids (B, T),
// labels (B, T), -100 past each caption's end}. An unreadable image is an error naming it.
CollateFn caption_collate(const data::ImageProcessorConfig& processor, const CaptionTokens& t);

// The fields caption_collate cuts when t.pad_multiple > 0, with their pad values: for
// Trainer::set_padded_fields, so that data ranks pad their slices alike.
std::vector<PaddedFields> caption_padded_fields(const CaptionTokens& t);

// Mean cross-entropy of the teacher-forced logits against the labels.
LossFn caption_loss_fn(std::shared_ptr<const models::PretrainedModel> model);

// Captions for the batch's images (every rank generates the whole global batch with the
// parameters the Predictor passes): "tokens" (B, max_new_tokens) i64, -1 after each end.
PredFn caption_predict_fn(std::shared_ptr<const models::PretrainedModel> model, models::GenerationConfig g);

// The Predictor of captions as text for evaluation rows (caption_eval_examples): collate, beam
// search with `num_beams` up to t.max_target_length tokens, and caption_text (caption_metrics.h).
// What `meshtrain caption` evaluates each epoch and `meshtrain eval` scores.
Predictor<std::string> caption_predictor(Deployer& deployer, std::shared_ptr<const models::PretrainedModel> model,
                                         const data::ImageProcessorConfig& processor, const CaptionTokens& t,
                                         int64_t num_beams, std::shared_ptr<const tokenizers::Tokenizer> tok);

}  // namespace mt::train
