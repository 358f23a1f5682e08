// `meshtrain image-classify`: a ViT image classifier (transformers' ViTForImageClassification)
// trained on images sorted into one folder per class (data/image_folder.h), from a Hugging Face
// ViT folder (a ViTModel gets a new classifier) or from scratch (--config small-vit|FILE).
// Each batch's images are decoded and preprocessed as ViTImageProcessor on the loader's thread;
// accuracy on the evaluation folder each epoch, the best checkpoint kept by it;
// predictions.jsonl (image, label, prediction), eval_results.json and the model folder (with
// id2label and its preprocessor_config.json) are written.
#include <algorithm>
#include <filesystem>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/eval_outputs.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/data/image_folder.h"
#include "meshtrain/data/image_processor.h"
#include "meshtrain/io/json.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/models/user_config.h"
#include "meshtrain/models/vit.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/image_classifier_task.h"
#include "meshtrain/train/model_image_processor.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct ImageClassifyOptions {
  std::string model, config, train_dir, eval_dir;
  bool skip_bad_images = false;
  StepFlags length{0, 3, 16, 1};
  AdamWFlags adamw{5e-4};
  LoraFlags lora;
  RunFlags run;
};

// A classifier of `classes`: a ViTForImageClassification folder as it is (its classes
// replaced when they differ, with a new classifier), a ViTModel folder with a new classifier,
// or a small ViT from scratch.
models::PretrainedModel classifier_model(const ImageClassifyOptions& o, const std::vector<std::string>& classes,
                                         const train::Deployer& deployer) {
  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  po.load_tokenizer = false;
  po.init_key = deployer.init_key();
  po.label_names = classes;
  po.num_labels = int64_t(classes.size());
  const models::ModelSpec& vit = models::model_spec("vit");
  json config = {{"model_type", "vit"},       {"architectures", {"ViTForImageClassification"}},
                 {"hidden_size", 128},         {"num_hidden_layers", 4},
                 {"num_attention_heads", 4},   {"intermediate_size", 512},
                 {"image_size", 32},           {"patch_size", 8},
                 {"num_channels", 3},          {"hidden_dropout_prob", 0.0}};
  if (!o.model.empty()) {
    po.new_params = models::NewParams::heads;
    models::PretrainedModel m = models::from_pretrained(o.model, po);
    MT_CHECK(m.config.holds<models::VitConfig>(), "[image-classify] ", o.model, ": model_type '", m.model_type,
             "' is not vit");
    if (m.config.as<models::VitConfig>().head == models::VitHead::image_classification) return m;
    // A ViTModel: the same encoder under a new classifier.
    json c = m.config_json();
    c["architectures"] = {"ViTForImageClassification"};
    po.new_params = models::NewParams::all;
    models::PretrainedModel head = models::init_model(c, po);
    for (const auto& [path, a] : m.params)
      if (head.params.contains(path)) head.params.set(path, a);
    head.source = m.source;
    return head;
  }
  if (o.config != "small-vit") {
    MT_CHECK(o.config.rfind("small-", 0) != 0, "[image-classify] unknown --config '", o.config,
             "' (small-vit or a config.json)");
    config = models::merge_user_config(vit, config, io::read_json_file(o.config), o.config, "image-classify");
    config["architectures"] = {"ViTForImageClassification"};
  }
  po.new_params = models::NewParams::all;
  return models::init_model(config, po);
}

void run(const ImageClassifyOptions& o) {
  MT_CHECK(o.model.empty() != o.config.empty(), "[image-classify] pass exactly one of --model DIR and --config "
           "small-vit|FILE");
  check_output_dir(o.run, "image-classify");
  train::arm_stop_request();
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  const fs::path out = o.run.output_dir;

  // The folders first: a bad layout or unreadable image stops the run before any model loads.
  const data::ImageFolder train_folder = data::read_image_folder(o.train_dir);
  const data::ImageFolder eval_folder = data::read_image_folder(o.eval_dir, train_folder.classes);
  const auto policy = o.skip_bad_images ? data::BadImages::skip : data::BadImages::stop;
  auto rows_of = [&](const data::ImageFolder& folder) {
    size_t skipped = 0;
    std::vector<data::Example> rows = train::image_classifier_examples(folder, policy, &skipped);
    if (skipped > 0) deployer.log("image-classify: skipped " + std::to_string(skipped) + " unreadable images");
    return rows;
  };
  const std::vector<data::Example> train_rows = rows_of(train_folder), eval_rows = rows_of(eval_folder);
  auto train_set = data::make_dataset(train_rows), eval_set = data::make_dataset(eval_rows);

  auto model = std::make_shared<models::PretrainedModel>(classifier_model(o, train_folder.classes, deployer));
  const auto& c = model->config.as<models::VitConfig>();
  const data::ImageProcessorConfig processor = train::model_image_processor(o.model, c.image_size);
  if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());
  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);

  train::FitOptions f;
  const int64_t total = plan_fit(o.length, train_set->size(), deployer, f);
  const int64_t span = schedule_steps(o.run, total);
  // A LoRA classifier trains its adapters and its new classifier.
  const WarmupCosineAdamW adamw =
      warmup_cosine_adamw(o.adamw, span, "image-classify", lora_wrap(o.lora, R"(classifier\..*)"));
  const optim::Schedule lr = adamw.learning_rate;
  const optim::Transform& opt = adamw.optimizer;
  deployer.log("image-classify: " + std::to_string(model->params.total_elements()) + " parameters; " +
               std::to_string(train_folder.classes.size()) + " classes (" + detail::join(train_folder.classes) + "); " +
               std::to_string(train_rows.size()) + " training / " + std::to_string(eval_rows.size()) +
               " evaluation images; " + std::to_string(total) + " steps on mesh " + deployer.mesh().str());

  std::shared_ptr<const models::PretrainedModel> frozen_model = model;
  const train::CollateFn collate = train::image_classifier_collate(processor);
  train::Trainer trainer(deployer, collate, train::image_classifier_loss_fn(frozen_model), std::move(model->params), opt,
                         plan);
  train::Predictor<int64_t> predictor(deployer, collate, train::image_classifier_predict_fn(frozen_model),
                                      [](const train::Batch& host) { return host["prediction"].to_ints(); });
  std::vector<int64_t> last_predictions;
  f.eval_fn = [&](const Params& p) {
    last_predictions = predictor.predict(p, eval_set, o.length.per_device_batch_size);
    int64_t right = 0;
    for (size_t i = 0; i < eval_rows.size(); ++i) right += last_predictions[i] == eval_rows[i].as_int("label");
    return std::map<std::string, double>{{"accuracy", double(right) / double(eval_rows.size())}};
  };
  f.save_best_by = "max:accuracy";
  apply_run_flags(o.run, f);
  f.checkpoint_extra = train::checkpoint_model_extra(model->config_json(), "", model->config.lora());
  f.checkpoint_extra["schedule_steps"] = span;
  f.checkpoint_extra[train::kImageProcessorKey] = processor.to_json();  // eval and generate preprocess alike
  f.learning_rate = lr;
  train::FitResult r = trainer.fit(train_set, f);
  if (!save_trained_weights(trainer, *model, o.lora, o.model.empty() ? o.config : o.model, "", o.run, deployer))
    return;
  if (fs::exists(out / "model"))
    data::save_image_processor_config(processor, (out / "model").string());
  std::vector<json> rows;
  for (size_t i = 0; i < last_predictions.size(); ++i)
    rows.push_back({{"image", eval_rows[i].str("image")},
                    {"label", train_folder.classes[size_t(eval_rows[i].as_int("label"))]},
                    {"prediction", train_folder.classes.at(size_t(last_predictions[i]))}});
  write_eval_outputs(out, rows, trainer.step(), r);
}

}  // namespace

void add_image_classify_command(CLI::App& app) {
  auto o = std::make_shared<ImageClassifyOptions>();
  o->run.output_dir = "runs/image-classify";
  CLI::App* cmd = app.add_subcommand(
      "image-classify", "train a ViT image classifier on images in one folder per class, evaluated by accuracy");
  cmd->add_option("--model", o->model, "Hugging Face ViT folder (ViTForImageClassification, or ViTModel: new classifier)");
  cmd->add_option("--config", o->config, "train from scratch: small-vit (32x32 images, 8x8 patches) or a config.json");
  cmd->add_option("--train-dir", o->train_dir, "training images: DIR/<class>/<image>.png|.jpg")->required();
  cmd->add_option("--eval-dir", o->eval_dir, "evaluation images, the same layout and classes")->required();
  cmd->add_flag("--skip-bad-images", o->skip_bad_images,
                "skip unreadable images (counted) instead of stopping before training");
  add_step_flags(cmd, o->length);
  add_adamw_flags(cmd, o->adamw);
  add_lora_flags(cmd, o->lora);
  add_run_flags(cmd, o->run, true);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
