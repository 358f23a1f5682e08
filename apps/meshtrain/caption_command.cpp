// `meshtrain caption`: an image captioner (a Hugging Face VisionEncoderDecoderModel folder with
// a ViT encoder and a GPT-2 decoder, or a small one from --config small-vit-gpt2|FILE) trained
// on captioned images with teacher forcing, through the pipeline's three functions
// (train/caption_task.h); evaluated each epoch by beam search through the Predictor: BLEU-4 as
// sacrebleu computes it against every reference of an image, ROUGE-L (the best over the
// references, averaged) and exact match (the prediction equals one of the references). Keeps
// the best checkpoint by BLEU; writes predictions.jsonl, eval_results.json and the final model
// (with its preprocessor_config.json) as a Hugging Face folder.
#include <algorithm>
#include <filesystem>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/eval_outputs.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/data/caption_rows.h"
#include "meshtrain/io/json.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/models/user_config.h"
#include "meshtrain/models/vision_encoder_decoder.h"
#include "meshtrain/train/caption_metrics.h"
#include "meshtrain/train/caption_task.h"
#include "meshtrain/train/model_image_processor.h"
#include "meshtrain/train/checkpoint_model.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct CaptionOptions {
  std::string model, config, tokenizer, data, eval_data, image_dir, eval_image_dir;
  int64_t max_target_length = 32;
  int64_t num_beams = 4;
  bool skip_bad_images = false;
  bool pad_to_max_length = false;
  StepFlags length{0, 3, 16, 1};
  AdamWFlags adamw{5e-4};
  LoraFlags lora;
  RunFlags run;
};

// Rows of a captions file whose images all decode (or whose unreadable ones are skipped).
std::vector<data::CaptionedImage> load_rows(const std::string& path, const std::string& image_dir, bool skip,
                                            const train::Deployer& deployer) {
  size_t skipped = 0;
  auto rows = data::check_images(data::read_captions(path, image_dir),
                                 skip ? data::BadImages::skip : data::BadImages::stop, &skipped);
  if (skipped > 0) deployer.log("caption: skipped " + std::to_string(skipped) + " unreadable images of " + path);
  return rows;
}

void run(const CaptionOptions& o) {
  MT_CHECK(o.num_beams >= 1, "[caption] --num-beams must be >= 1, got ", o.num_beams);
  MT_CHECK(o.model.empty() != o.config.empty(), "[caption] pass exactly one of --model DIR and --config "
           "small-vit-gpt2|FILE");
  check_output_dir(o.run, "caption");
  train::arm_stop_request();
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  const fs::path out = o.run.output_dir;

  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  po.load_tokenizer = o.tokenizer.empty() && !o.model.empty();
  std::shared_ptr<tokenizers::Tokenizer> tok = o.tokenizer.empty() ? nullptr : tokenizers::load_tokenizer(o.tokenizer);
  std::shared_ptr<models::PretrainedModel> model;
  if (!o.model.empty()) {
    model = std::make_shared<models::PretrainedModel>(models::from_pretrained(o.model, po));
    if (!tok) tok = model->tokenizer;
  } else {
    MT_CHECK(tok != nullptr, "[caption] --config needs --tokenizer PATH (the vocabulary sets the model's size)");
    const auto eos = end_of_text_id(*tok);
    MT_CHECK(eos, "[caption] ", o.tokenizer, " has no end token (</s>, [SEP], <|endoftext|>)");
    const models::ModelSpec& spec = models::model_spec("vision-encoder-decoder");
    const int64_t vocab = (tok->vocab_size() + 63) / 64 * 64;
    const int64_t context = std::max<int64_t>(64, o.max_target_length + 1);
    json config;
    if (o.config == "small-vit-gpt2") {
      config = spec.small_config(vocab, context, *eos);
    } else {
      MT_CHECK(o.config.rfind("small-", 0) != 0, "[caption] unknown --config '", o.config,
               "' (small-vit-gpt2 or a config.json)");
      config = models::merge_user_config(spec, spec.small_config(vocab, context, *eos), io::read_json_file(o.config),
                                         o.config, "caption");
    }
    po.new_params = models::NewParams::all;
    po.init_key = deployer.init_key();
    model = std::make_shared<models::PretrainedModel>(models::init_model(config, po));
  }
  MT_CHECK(model->config.holds<models::VisionEncoderDecoderConfig>(), "[caption] ", o.model.empty() ? o.config : o.model,
           ": model_type '", model->model_type, "' is not an image-to-text model (use ",
           models::model_types_text(models::ModelKind::image_to_text), ")");
  MT_CHECK(tok != nullptr, "[caption] ", o.model, " has no tokenizer: pass --tokenizer PATH");
  const auto& c = model->config.as<models::VisionEncoderDecoderConfig>();
  const data::ImageProcessorConfig processor = train::model_image_processor(o.model, c.encoder.image_size);

  // Each batch cut after its last caption token (rounded up to 8), unless --pad-to-max-length;
  // --dry-run measures at full width.
  const int64_t pad_multiple = o.pad_to_max_length || o.run.dry_run ? 0 : 8;
  const train::CaptionTokens t{c.pad_token_id, c.eos_token_id, c.decoder_start_token_id, o.max_target_length,
                               pad_multiple};
  const std::string eval_dir = o.eval_image_dir.empty() ? o.image_dir : o.eval_image_dir;
  const auto train_rows = load_rows(o.data, o.image_dir, o.skip_bad_images, deployer);
  const auto eval_rows = load_rows(o.eval_data, eval_dir, o.skip_bad_images, deployer);
  auto train_set = data::make_dataset(train::caption_train_examples(train_rows, *tok, t));
  auto eval_set = data::make_dataset(train::caption_eval_examples(eval_rows));
  if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());

  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);
  train::FitOptions f;
  const int64_t total = plan_fit(o.length, train_set->size(), deployer, f);
  const int64_t span = schedule_steps(o.run, total);
  const WarmupCosineAdamW adamw = warmup_cosine_adamw(o.adamw, span, "caption", lora_wrap(o.lora));
  const optim::Schedule lr = adamw.learning_rate;
  const optim::Transform& opt = adamw.optimizer;
  deployer.log("caption: " + std::to_string(model->params.total_elements()) + " parameters; " + o.data + ": " +
               std::to_string(train_rows.size()) + " images, " + std::to_string(train_set->size()) + " captions; " +
               std::to_string(eval_rows.size()) + " eval images; " + std::to_string(total) + " steps on mesh " +
               deployer.mesh().str() + ", beam search with " + std::to_string(o.num_beams) + " beams");

  std::shared_ptr<const models::PretrainedModel> frozen_model = model;
  train::CollateFn collate = train::caption_collate(processor, t);
  train::Trainer trainer(deployer, collate, train::caption_loss_fn(frozen_model), std::move(model->params), opt, plan);
  if (pad_multiple > 0) trainer.set_padded_fields(train::caption_padded_fields(t));

  train::Predictor<std::string> predictor =
      train::caption_predictor(deployer, frozen_model, processor, t, o.num_beams, tok);
  std::vector<std::string> last_predictions;
  std::vector<std::vector<std::string>> references;
  for (const auto& row : eval_rows) references.push_back(row.captions);
  auto evaluate = [&](const Params& p) {
    last_predictions = predictor.predict(p, eval_set, o.length.per_device_batch_size);
    return train::caption_metrics(last_predictions, references);
  };
  f.eval_fn = evaluate;
  f.save_best_by = "max:bleu";
  apply_run_flags(o.run, f);
  const std::string tokenizer_source = o.tokenizer.empty() ? model->source : o.tokenizer;
  const std::string tokenizer_ref =
      o.lora.enabled() && !o.lora.merge ? fs::absolute(tokenizer_source).string() : "../../model";
  f.checkpoint_extra = train::checkpoint_model_extra(model->config_json(), tokenizer_ref, model->config.lora());
  f.checkpoint_extra["schedule_steps"] = span;
  f.checkpoint_extra[train::kImageProcessorKey] = processor.to_json();  // generate/eval preprocess as training did
  f.learning_rate = lr;
  train::FitResult r = trainer.fit(train_set, f);
  if (!save_trained_weights(trainer, *model, o.lora, o.model.empty() ? o.config : o.model, tokenizer_source, o.run,
                            deployer))
    return;
  const fs::path model_dir = out / "model";
  if (fs::exists(model_dir))
    data::save_image_processor_config(processor, model_dir.string());
  std::vector<json> rows;
  for (size_t i = 0; i < last_predictions.size(); ++i)
    rows.push_back({{"image", eval_rows[i].image}, {"reference", eval_rows[i].captions}, {"prediction", last_predictions[i]}});
  write_eval_outputs(out, rows, trainer.step(), r);
}

}  // namespace

void add_caption_command(CLI::App& app) {
  auto o = std::make_shared<CaptionOptions>();
  o->run.output_dir = "runs/caption";
  CLI::App* cmd = app.add_subcommand(
      "caption", "train an image captioner (ViT encoder, GPT-2 decoder) on captioned images, evaluated with beam "
                 "search, BLEU-4 and ROUGE-L");
  cmd->add_option("--model", o->model, "Hugging Face VisionEncoderDecoderModel directory to start from");
  cmd->add_option("--config", o->config, "train from scratch: small-vit-gpt2 or a config.json");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file or directory (default: the model directory's)");
  cmd->add_option("--data", o->data, "training captions: JSON lines {image, caption} or COCO captions JSON")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--eval-data", o->eval_data, "evaluation captions (same layouts)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--image-dir", o->image_dir, "the directory the captions files name images in")->required();
  cmd->add_option("--eval-image-dir", o->eval_image_dir, "the evaluation images' directory (default: --image-dir)");
  cmd->add_option("--max-target-length", o->max_target_length, "caption tokens kept, and generated at most")
      ->capture_default_str()->check(positive());
  cmd->add_option("--num-beams", o->num_beams, "beam search width in evaluation (1: greedy)")->capture_default_str();
  cmd->add_flag("--skip-bad-images", o->skip_bad_images,
                "skip unreadable images (counted) instead of stopping before training");
  add_boolean_flag(cmd, "--pad-to-max-length,--pad_to_max_length", o->pad_to_max_length,
                   "every batch --max-target-length wide (default: cut after its longest caption, rounded up to 8)");
  add_step_flags(cmd, o->length);
  add_adamw_flags(cmd, o->adamw);
  add_lora_flags(cmd, o->lora);
  add_run_flags(cmd, o->run, true);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
