// Image captioning, the Redco paper's second pipeline (its Figure 4): collate returns the
// images' pixel_values and the captions' token ids, loss is the cross-entropy of a
// vision-encoder / text-decoder model (a small ViT reading the image, a GPT-2 whose blocks
// cross-attend to it), predict is beam search over the image. The images are drawn here: two
// coloured shapes side by side or one above the other, 32x32 pixels, captioned
// "a red circle left of a blue square". The model is trained from scratch and captions
// held-out images it has never seen.
//
//   example_caption [steps=1200] [workdir=runs/caption]
//
// Runs unchanged under `mpirun -np 2` (data parallel: each process collates half of every
// batch), and tensor parallel with options.mesh = "model=2".
#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "meshtrain/meshtrain.h"
#include "meshtrain/data/image_processor.h"
#include "meshtrain/models/vision_encoder_decoder.h"
#include "meshtrain/train/bleu.h"

using namespace mt;

constexpr int64_t kSize = 32;     // pixels per side
constexpr int64_t kMaxLen = 10;   // "a red circle left of a blue square" is 8 words; the end token closes it
const std::map<std::string, std::array<uint8_t, 3>> kColors = {
    {"red", {220, 40, 40}}, {"green", {40, 170, 60}}, {"blue", {40, 70, 220}}, {"yellow", {230, 200, 30}}};
const std::vector<std::string> kShapes = {"circle", "square", "triangle"};

// A filled shape in the box [x0, x0 + s) x [y0, y0 + s): a disc, the box, or a triangle
// pointing up; tested at pixel centres.
void draw(data::Image& im, const std::string& shape, const std::array<uint8_t, 3>& rgb, int64_t x0, int64_t y0, int64_t s) {
  for (int64_t y = y0; y < y0 + s; ++y)
    for (int64_t x = x0; x < x0 + s; ++x) {
      const double u = (double(x - x0) + 0.5) / double(s), v = (double(y - y0) + 0.5) / double(s);  // in [0, 1)
      const bool inside = shape == "square"   ? true
                          : shape == "circle" ? (u - 0.5) * (u - 0.5) + (v - 0.5) * (v - 0.5) <= 0.25
                                              : std::abs(u - 0.5) <= v / 2;
      if (inside) std::copy(rgb.begin(), rgb.end(), im.rgb.begin() + (y * kSize + x) * 3);
    }
}

struct Picture {
  data::Image image;
  std::string caption;
};

Picture render(std::mt19937& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  std::vector<std::string> colors;
  for (const auto& [name, rgb] : kColors) colors.push_back(name);
  std::shuffle(colors.begin(), colors.end(), rng);
  const std::string s1 = kShapes[size_t(pick(0, 2))], s2 = kShapes[size_t(pick(0, 2))];
  const bool beside = pick(0, 1) == 0;
  Picture p;
  p.image.width = p.image.height = kSize;
  p.image.rgb.assign(size_t(kSize * kSize * 3), 245);
  const int64_t s = pick(9, 12), a = pick(2, kSize - s - 2), b = std::clamp<int64_t>(a + pick(-3, 3), 1, kSize - s - 1);
  const int64_t near = pick(1, 3), far = pick(17, kSize - s - 1);
  if (beside) {
    draw(p.image, s1, kColors.at(colors[0]), near, a, s);
    draw(p.image, s2, kColors.at(colors[1]), far, b, s);
  } else {
    draw(p.image, s1, kColors.at(colors[0]), a, near, s);
    draw(p.image, s2, kColors.at(colors[1]), b, far, s);
  }
  p.caption = "a " + colors[0] + " " + s1 + (beside ? " left of a " : " above a ") + colors[1] + " " + s2;
  return p;
}

int main(int argc, char** argv) {
  return dist::run_guarded([&] {
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 1200;
    MT_CHECK(steps > 0, "steps must be positive, got ", steps);
    const std::string workdir = argc > 2 ? argv[2] : "runs/caption";

    // The pictures (the same on every process: one seed), the last 100 held out, and a
    // WordPiece vocabulary of BERT's special tokens and the caption words.
    std::mt19937 rng(11);
    std::vector<Picture> pictures;
    for (int i = 0; i < 2000 + 100; ++i) pictures.push_back(render(rng));
    std::filesystem::create_directories(workdir);
    std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nleft\nof\nabove\n";
    for (const auto& [name, rgb] : kColors) vocab += name + "\n";
    for (const std::string& shape : kShapes) vocab += shape + "\n";
    io::write_file_atomic(workdir + "/vocab.txt", vocab);
    auto tokenizer = tokenizers::load_tokenizer(workdir + "/vocab.txt");
    std::vector<data::Example> rows;
    for (size_t i = 0; i < pictures.size(); ++i) rows.push_back({{"index", int64_t(i)}});
    auto train_set = data::make_dataset({rows.begin(), rows.end() - 100});
    auto test_set = data::make_dataset({rows.end() - 100, rows.end()});

    train::DeployerOptions options;
    options.workdir = workdir;
    train::Deployer deployer(options);
    // A small ViT-GPT2 (4 + 4 layers, width 128, 8x8 patches) from scratch: [SEP] ends a
    // caption and starts the decoder, [PAD] pads.
    const int64_t pad = *tokenizer->token_to_id("[PAD]"), eos = *tokenizer->token_to_id("[SEP]");
    models::PretrainedOptions init;
    init.init_key = deployer.init_key();
    nlohmann::json config = models::model_spec("vision-encoder-decoder").small_config(tokenizer->vocab_size(), 64, eos);
    config["pad_token_id"] = pad;
    const models::PretrainedModel model = models::init_model(config, init);
    const auto& c = model.config.as<models::VisionEncoderDecoderConfig>();
    data::ImageProcessorConfig processor;  // ViTImageProcessor's defaults at the encoder's size
    processor.height = processor.width = c.encoder.image_size;

    // collate: the images as pixel_values (B, 3, 32, 32), the captions as labels closed by
    // the end token and padded with -100, and the decoder's inputs (the labels shifted right
    // behind its start token: teacher forcing).
    auto collate_fn = [&](const std::vector<data::Example>& batch) {
      const int64_t n = int64_t(batch.size());
      std::vector<data::Image> images;
      std::vector<int64_t> labels(size_t(n * kMaxLen), -100);
      for (int64_t i = 0; i < n; ++i) {
        const Picture& p = pictures[size_t(batch[size_t(i)].as_int("index"))];
        images.push_back(p.image);
        std::vector<int32_t> ids = tokenizer->encode(p.caption, /*add_special_tokens=*/false).ids;
        ids.resize(std::min<size_t>(ids.size(), kMaxLen - 1));
        ids.push_back(int32_t(eos));
        std::copy(ids.begin(), ids.end(), labels.begin() + i * kMaxLen);
      }
      const Array label_array = Array::from_vector(labels, {n, kMaxLen});
      return train::Batch{{"pixel_values", data::pixel_values(images, processor)},
                          {"labels", label_array},
                          {"decoder_input_ids", models::shift_right(label_array, c.decoder_start_token_id, pad)}};
    };
    // loss: the cross-entropy of the decoder's next-token logits; dropout only while training.
    auto loss_fn = [&](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
      return cross_entropy(
          models::vision_encoder_decoder_logits(c, p, b["pixel_values"], b["decoder_input_ids"], Array(), key, training),
          b["labels"]);
    };
    // predict: beam search (3 beams) over each image; every process captions the whole
    // global batch with the parameters given. Output "tokens" (B, kMaxLen), padded.
    auto pred_fn = [&](const Params& p, const train::Batch& b) {
      models::GenerationConfig beams;
      beams.max_new_tokens = kMaxLen, beams.num_beams = 3, beams.pad_token_id = pad;
      const models::GenerationResult r = models::generate_captions(c, p, dist::to_host(b["pixel_values"]), beams);
      std::vector<int64_t> out(r.tokens.size() * kMaxLen, pad);
      for (size_t i = 0; i < r.tokens.size(); ++i)
        std::copy(r.tokens[i].begin(), r.tokens[i].end(), out.begin() + long(i * kMaxLen));
      return train::Batch{{"tokens", Array::from_vector(out, {int64_t(r.tokens.size()), kMaxLen})}};
    };

    auto lr = optim::warmup_cosine_decay_schedule(0.0, 1e-3, steps / 20, steps, 1e-4);
    auto optimizer = optim::chain({optim::clip_by_global_norm(1.0), optim::adamw(lr)});
    train::Trainer trainer(deployer, collate_fn, loss_fn, model.params, optimizer,
                           deployer.sharding_rules(model.params, model.param_roles()));
    train::Predictor<std::string> predictor(deployer, collate_fn, pred_fn, [&](const train::Batch& host) {
      const std::vector<int64_t> t = host["tokens"].to_ints();
      std::vector<std::string> texts;
      for (size_t i = 0; i < t.size(); i += kMaxLen) {
        std::vector<int32_t> ids;
        for (size_t k = i; k < i + kMaxLen && t[k] != eos && t[k] >= 0; ++k) ids.push_back(int32_t(t[k]));
        texts.push_back(tokenizer->decode(ids, true));
      }
      return texts;
    });

    train::FitOptions fit;
    fit.per_device_batch_size = 32 / deployer.data_size();
    fit.epochs = 1000;  // max_steps ends the run
    fit.max_steps = steps;
    fit.learning_rate = lr;
    fit.save_last = false;
    train::FitResult result = trainer.fit(train_set, fit);

    // The held-out images captioned by beam search, scored by exact match and BLEU-4.
    const std::vector<std::string> predictions = predictor.predict(trainer.params(), test_set, 50);
    std::vector<std::vector<std::string>> references;
    double exact = 0;
    for (size_t i = 0; i < predictions.size(); ++i) {
      const std::string& truth = pictures[pictures.size() - 100 + i].caption;
      references.push_back({truth});
      exact += predictions[i] == truth;
    }
    exact /= double(predictions.size());
    const std::vector<double>& losses = result.losses;
    const size_t k = std::max<size_t>(1, losses.size() / 10);
    const double first = std::accumulate(losses.begin(), losses.begin() + long(k), 0.0) / double(k),
                 last = std::accumulate(losses.end() - long(k), losses.end(), 0.0) / double(k);
    deployer.log("train loss " + std::to_string(first) + " -> " + std::to_string(last) + " (mean of the first and last " +
                 std::to_string(k) + " steps)");
    deployer.log("held out: exact match " + std::to_string(exact) + ", BLEU-4 " +
                 std::to_string(train::corpus_bleu(predictions, references).score) + " on " +
                 std::to_string(predictions.size()) + " images (beam search, 3 beams)");
    for (size_t i = 0; i < 4; ++i)
      deployer.log("  " + pictures[pictures.size() - 100 + i].caption + "  ->  " + predictions[i]);
    if (!(last < first)) deployer.log("error: the loss did not fall");
    if (exact < 0.8) deployer.log("error: exact match below 0.8");
    return last < first && exact >= 0.8 ? 0 : 1;
  });
}
