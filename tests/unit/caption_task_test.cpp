// The captioning pipeline's three functions (issue 47) on python3-sklearn's two photographs with
// GPT-2's tokenizer and the small ViT-GPT2 config: collate decodes and preprocesses the images
// (equal to data::pixel_values on them), ends each caption with eos and pads labels with -100
// behind the shifted decoder inputs; the loss trains (a Trainer memorizes three captions) and its
// gradient reaches both the image encoder and the decoder; predict returns each image's caption
// tokens, -1 after the end.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "meshtrain/autodiff/value_and_grad.h"
#include "meshtrain/data/image_decode.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/optim/transform.h"
#include "tests/support/op_check.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/caption_task.h"

namespace mt::testing {
namespace {

const std::string kPhotos = "/usr/lib/python3/dist-packages/sklearn/datasets/images/";

TEST(CaptionTask, CollateLossAndPredictOfAViTGpt2) {
  auto tok = tokenizers::load_tokenizer(std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2");
  const int64_t eos = *tok->token_to_id("<|endoftext|>");
  const int64_t vocab = (tok->vocab_size() + 63) / 64 * 64;
  const nlohmann::json config = models::model_spec("vision-encoder-decoder").small_config(vocab, 32, eos);
  auto model = std::make_shared<models::PretrainedModel>(models::init_model(config, {.load_tokenizer = false}));
  const auto& c = model->config.as<models::VisionEncoderDecoderConfig>();
  data::ImageProcessorConfig processor;
  processor.height = processor.width = c.encoder.image_size;
  const train::CaptionTokens t{.pad_id = eos, .eos_id = eos, .decoder_start_id = eos, .max_target_length = 8};

  const std::vector<data::CaptionedImage> images = {
      {kPhotos + "china.jpg", {"a pagoda among green trees on a hill", "a temple"}},
      {kPhotos + "flower.jpg", {"a flower"}}};
  const auto rows = train::caption_train_examples(images, *tok, t);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].tokens("labels").size(), 8u);  // truncated to max_target_length, eos last
  EXPECT_EQ(rows[0].tokens("labels").back(), eos);
  EXPECT_EQ(rows[1].tokens("labels").back(), eos);

  const train::CollateFn collate = train::caption_collate(processor, t);
  const train::Batch batch = collate(rows);
  const Array want = data::pixel_values(
      {data::read_image(kPhotos + "china.jpg"), data::read_image(kPhotos + "china.jpg"), data::read_image(kPhotos + "flower.jpg")},
      processor);
  EXPECT_EQ(max_abs_diff(batch["pixel_values"], want), 0.0);
  const std::vector<int64_t> labels = batch["labels"].to_ints(), dec = batch["decoder_input_ids"].to_ints();
  const int64_t width = batch["labels"].dim(1);
  EXPECT_EQ(width, 8);
  const size_t short_len = rows[2].tokens("labels").size();
  for (int64_t j = 0; j < width; ++j) {
    EXPECT_EQ(labels[size_t(2 * width + j)], size_t(j) < short_len ? rows[2].tokens("labels")[size_t(j)] : -100);
    EXPECT_EQ(dec[size_t(2 * width + j)], j == 0 ? eos : (labels[size_t(2 * width + j - 1)] == -100 ? eos : labels[size_t(2 * width + j - 1)]));
  }

  const train::LossFn loss = train::caption_loss_fn(model);
  auto [value, grads] = value_and_grad([&](const Params& p) { return loss(p, batch, RngKey{1, 0}, false); })(model->params);
  EXPECT_TRUE(std::isfinite(value.item()));
  EXPECT_GT(max_abs_diff(grads["encoder.embeddings.patch_embeddings.projection.weight"], Array::zeros(Shape{128, 192})), 0.0);
  EXPECT_GT(max_abs_diff(grads["decoder.transformer.h.0.crossattention.q_attn.weight"], Array::zeros(Shape{128, 128})), 0.0);

  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mt_caption_task_" + std::to_string(getpid()));
  train::Deployer deployer({.seed = 3, .workdir = dir.string(), .verbose = false});
  train::Trainer trainer(deployer, collate, loss, model->params, optim::adamw(optim::constant_schedule(1e-3)));
  train::FitOptions o;
  o.per_device_batch_size = 3, o.epochs = 30, o.progress = false, o.save_last = false;
  const train::FitResult fit = trainer.fit(data::make_dataset(rows), o);
  std::printf("caption loss %.4f -> %.4f over %zu steps\n", fit.losses.front(), fit.losses.back(), fit.losses.size());
  EXPECT_LT(fit.losses.back(), 0.5 * fit.losses.front());

  models::GenerationConfig g;
  g.max_new_tokens = 8, g.num_beams = 2;
  const train::Batch eval = train::caption_collate(processor, t)(train::caption_eval_examples(images));
  EXPECT_FALSE(eval.contains("labels"));
  const train::Batch out = train::caption_predict_fn(model, g)(trainer.params(), eval);
  ASSERT_EQ(out["tokens"].shape(), (Shape{2, 8}));
  const std::vector<int64_t> toks = out["tokens"].to_ints();
  for (int64_t r = 0; r < 2; ++r) {
    bool ended = false;
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t v = toks[size_t(r * 8 + j)];
      if (ended) EXPECT_EQ(v, -1);
      else EXPECT_TRUE(v >= 0 && v < vocab);
      ended = ended || v == eos || v == -1;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::testing
