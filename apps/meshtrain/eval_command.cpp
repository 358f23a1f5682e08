// `meshtrain eval`: scores a model — a meshtrain run or checkpoint directory, or a Hugging
// Face directory — on a dataset. Decoders: token-weighted mean loss and perplexity over
// every sequence of a text file (the last batch padded, its padding dropped). BERT
// classifiers: the GLUE task's metrics on a split. Image-to-text models: captions of a captions
// file's images by beam search, BLEU-4, ROUGE-L and exact match. ViT classifiers: accuracy
// over a folder per class. Prints JSON and, with --output, writes it.
#include <algorithm>
#include <cmath>
#include <iostream>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/glue_setup.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/data/caption_rows.h"
#include "meshtrain/data/classification_files.h"
#include "meshtrain/data/image_folder.h"
#include "meshtrain/models/class_labels.h"
#include "meshtrain/models/vit.h"
#include "meshtrain/train/image_classifier_task.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/models/vision_encoder_decoder.h"
#include "meshtrain/train/caption_metrics.h"
#include "meshtrain/train/caption_task.h"
#include "meshtrain/train/model_image_processor.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/predictor.h"

namespace mt::cli {
namespace {

using json = nlohmann::json;

struct EvalOptions {
  std::string model;
  LmDataFlags data;
  std::string task, data_dir, split;
  std::string validation_file;  // a classifier trained on `glue --train-file` data
  int64_t max_seq_length = 128;
  bool pad_to_max_length = false;  // BERT classifiers: no dropout here, so cut batches score alike
  int64_t pad_to_multiple_of = 8;
  int64_t per_device_batch_size = 8;
  int64_t max_eval_samples = -1;
  std::string output;
  std::string image_dir, predictions;  // captioners: the images' directory; a predictions.jsonl to write
  int64_t num_beams = 4;
  int64_t max_target_length = 32;
  bool skip_bad_images = false;
  bool allow_new_heads = false;
  std::string adapter;
  RunFlags run;
  EvalOptions() { data.seq_len = 0; }  // 0: the model's context
};

// (sum of token losses, number of target tokens) per sequence.
json eval_decoder(train::Deployer& deployer, const models::PretrainedModel& model, const Params& params,
                  const EvalOptions& o) {
  MT_CHECK(model.tokenizer != nullptr, "[eval] ", o.model, " has no tokenizer");
  // Sequences as long as the model's context unless --seq-len says otherwise.
  LmDataFlags flags = o.data;
  const int64_t context = model.causal_lm().max_positions;
  if (flags.seq_len == 0) flags.seq_len = context > 0 ? context : 512;
  MT_CHECK(context == 0 || flags.seq_len <= context, "[eval] --seq-len ", flags.seq_len, " exceeds the context of ", o.model,
           " (", context, " positions)");
  LmCorpus corpus = make_lm_corpus(flags, model.tokenizer);
  train::CollateFn collate = lm_collate();
  train::Predictor<std::pair<double, double>> predictor(
      deployer, collate,
      [&model](const Params& p, const train::Batch& b) {
        models::DecoderInputs in;
        in.input_ids = b["input_ids"];
        Array nll = cross_entropy(model.decoder_logits(p, in, RngKey{}, false), b["labels"], -100, 0.0, Reduction::none);
        return train::Batch{{"nll", sum(nll, {1})}, {"labels", b["labels"]}};
      },
      [](const train::Batch& out) {
        std::vector<double> nll = out["nll"].to_doubles(), labels = out["labels"].to_doubles();
        const size_t t = labels.size() / nll.size();
        std::vector<std::pair<double, double>> items;
        for (size_t i = 0; i < nll.size(); ++i)
          items.emplace_back(nll[i], double(std::count_if(labels.begin() + long(i * t), labels.begin() + long((i + 1) * t),
                                                          [](double l) { return l != -100; })));
        return items;
      });
  double total = 0, tokens = 0;
  for (const auto& [nll, n] : predictor.predict(params, corpus.dataset, o.per_device_batch_size)) {
    total += nll;
    tokens += n;
  }
  MT_CHECK(tokens > 0, "[eval] ", o.data.data, " yields no target tokens");
  return {{"data", o.data.data}, {"seq_len", flags.seq_len}, {"sequences", corpus.dataset->size()}, {"tokens", int64_t(tokens)},
          {"eval_loss", total / tokens}, {"perplexity", std::exp(total / tokens)}};
}

json eval_glue(train::Deployer& deployer, const models::PretrainedModel& model, const Params& params,
               const EvalOptions& o) {
  MT_CHECK(model.tokenizer != nullptr, "[eval] ", o.model, " has no tokenizer");
  const models::BertConfig& bert = model.config.as<models::BertConfig>();
  MT_CHECK(bert.head == models::BertHead::sequence_classification, "[eval] ", o.model, " is a ",
           models::bert_architecture(bert.head), ", not a sequence classifier: evaluate what glue trained (its run, "
           "a checkpoint or its model/ folder)");
  data::GlueTask task;
  std::vector<data::Example> rows;
  std::string split = o.validation_file;
  if (!o.validation_file.empty()) {
    // The classes are the model's id2label (numbered 0..n-1 when it has only placeholders).
    const models::BertConfig& c = model.config.as<models::BertConfig>();
    const std::vector<std::string> classes = c.num_labels > 1 ? models::class_names(c.num_labels, c.label_names) : c.label_names;
    task = data::classification_task(o.validation_file, classes);
    rows = data::read_classification_rows(o.validation_file, task);
  } else {
    MT_CHECK(!o.task.empty() && !o.data_dir.empty(), "[eval] a BERT classifier is evaluated on a GLUE task (--task and "
             "--data-dir) or on your rows (--validation-file)");
    task = data::glue_task(o.task);
    split = o.split.empty() ? task.dev_split : o.split;
    rows = data::read_glue_split(o.data_dir, task, split);
  }
  MT_CHECK(task.num_labels() == bert.num_labels, "[eval] ", o.model, " has ", bert.num_labels,
           bert.num_labels == 1 ? " output (a regression head)" : " classes", "; ", task.name, " ",
           task.is_regression() ? std::string("is a regression task (1 output)")
                                : "has " + std::to_string(task.num_labels()) + " classes");
  if (o.max_eval_samples >= 0 && int64_t(rows.size()) > o.max_eval_samples) rows.resize(size_t(o.max_eval_samples));
  auto dataset = data::make_dataset(std::move(rows));
  auto tok = model.tokenizer;
  const int64_t max_len = length_within_positions(o.max_seq_length, bert.max_position_embeddings, "--max-seq-length",
                                                  o.model, deployer, "eval");
  glue_fixed_length(*tok, max_len);
  json result = {{"task", task.name}, {"split", split}, {"examples", dataset->size()}};
  // Each batch cut to its longest row unless --pad_to_max_length: evaluation has no dropout, so
  // the scores are the same up to rounding, on fewer positions.
  const int64_t pad_multiple = o.pad_to_max_length ? 0 : o.pad_to_multiple_of;
  for (const auto& [k, v] :
       glue_evaluate(deployer, model, params, task, glue_collate(tok, task, max_len, pad_multiple), dataset,
                     o.per_device_batch_size, pad_multiple > 0 ? glue_padded_fields(*tok) : std::vector<train::PaddedFields>{}))
    result["eval_" + k] = v;
  return result;
}

// Image-to-text models: captions by beam search for every image of a captions file, scored
// as `meshtrain caption` scores them (BLEU-4, ROUGE-L, exact match against all references).
json eval_captioner(train::Deployer& deployer, const models::PretrainedModel& model, const Params& params,
                    const EvalOptions& o) {
  MT_CHECK(model.tokenizer != nullptr, "[eval] ", o.model, " has no tokenizer");
  MT_CHECK(!o.data.data.empty() && !o.image_dir.empty(), "[eval] an image-to-text model is evaluated on captioned "
           "images: --data captions.jsonl|COCO.json and --image-dir DIR");
  MT_CHECK(o.num_beams >= 1, "[eval] --num-beams must be >= 1, got ", o.num_beams);
  const auto& c = model.config.as<models::VisionEncoderDecoderConfig>();
  size_t skipped = 0;
  auto rows = data::check_images(data::read_captions(o.data.data, o.image_dir),
                                 o.skip_bad_images ? data::BadImages::skip : data::BadImages::stop, &skipped);
  if (o.max_eval_samples >= 0 && int64_t(rows.size()) > o.max_eval_samples) rows.resize(size_t(o.max_eval_samples));
  MT_CHECK(!rows.empty(), "[eval] ", o.data.data, " lists no readable images");
  const train::CaptionTokens t{c.pad_token_id, c.eos_token_id, c.decoder_start_token_id, o.max_target_length};
  train::Predictor<std::string> predictor =
      train::caption_predictor(deployer, std::make_shared<const models::PretrainedModel>(model),
                               train::model_image_processor(o.model, c.encoder.image_size), t, o.num_beams, model.tokenizer);
  const std::vector<std::string> predictions =
      predictor.predict(params, data::make_dataset(train::caption_eval_examples(rows)), o.per_device_batch_size);
  std::vector<std::vector<std::string>> references;
  for (const auto& row : rows) references.push_back(row.captions);
  json result = {{"data", o.data.data}, {"images", rows.size()}, {"skipped_images", skipped}, {"num_beams", o.num_beams}};
  for (const auto& [k, v] : train::caption_metrics(predictions, references)) result["eval_" + k] = v;
  if (deployer.is_main() && !o.predictions.empty()) {
    std::string lines;
    for (size_t i = 0; i < rows.size(); ++i)
      lines += json{{"image", rows[i].image}, {"reference", rows[i].captions}, {"prediction", predictions[i]}}.dump() + "\n";
    io::write_file_atomic(o.predictions, lines);
  }
  return result;
}

// ViT image classifiers: accuracy over images in one folder per class (--image-dir), the
// classes being the model's id2label.
json eval_image_classifier(train::Deployer& deployer, const models::PretrainedModel& model, const Params& params,
                           const EvalOptions& o) {
  MT_CHECK(!o.image_dir.empty(), "[eval] an image classifier is evaluated on --image-dir DIR (DIR/<class>/<image>)");
  const auto& c = model.config.as<models::VitConfig>();
  const std::vector<std::string> classes = models::class_names(c.num_labels, c.label_names);
  size_t skipped = 0;
  std::vector<data::Example> rows = train::image_classifier_examples(
      data::read_image_folder(o.image_dir, classes), o.skip_bad_images ? data::BadImages::skip : data::BadImages::stop,
      &skipped);
  if (o.max_eval_samples >= 0 && int64_t(rows.size()) > o.max_eval_samples) rows.resize(size_t(o.max_eval_samples));
  auto shared = std::make_shared<const models::PretrainedModel>(model);
  train::Predictor<int64_t> predictor(deployer, train::image_classifier_collate(train::model_image_processor(o.model, c.image_size)),
                                      train::image_classifier_predict_fn(shared),
                                      [](const train::Batch& host) { return host["prediction"].to_ints(); });
  const std::vector<int64_t> predictions = predictor.predict(params, data::make_dataset(rows), o.per_device_batch_size);
  int64_t right = 0;
  std::string lines;
  for (size_t i = 0; i < rows.size(); ++i) {
    right += predictions[i] == rows[i].as_int("label");
    lines += json{{"image", rows[i].str("image")}, {"label", classes[size_t(rows[i].as_int("label"))]},
                  {"prediction", classes.at(size_t(predictions[i]))}}.dump() + "\n";
  }
  if (deployer.is_main() && !o.predictions.empty()) io::write_file_atomic(o.predictions, lines);
  return {{"image_dir", o.image_dir}, {"images", rows.size()}, {"skipped_images", skipped},
          {"eval_accuracy", double(right) / double(rows.size())}};
}

void run(const EvalOptions& o) {
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  if (o.allow_new_heads) po.new_params = models::NewParams::all;
  if (!o.adapter.empty()) models::adapter_base_options(o.adapter, po);  // a classifier adapter makes a classifier
  models::PretrainedModel model = train::is_checkpoint_path(o.model)
                                      ? train::load_checkpoint_model(o.model, deployer.mesh(), po)
                                      : models::from_pretrained(o.model, po);
  apply_adapter(model, o.adapter, deployer.is_main());
  train::ShardingPlan plan = make_plan(deployer, model.params, model.param_roles(), o.run);
  if (o.run.dry_run) {
    deployer.log("dry run: nothing evaluated");
    throw train::DryRunDone("dry run: nothing evaluated");
  }
  // Options for another kind of model are an error, not ignored.
  const bool bert = model.config.holds<models::BertConfig>();
  MT_CHECK(bert || (o.task.empty() && o.data_dir.empty() && o.validation_file.empty()), "[eval] --task, --data-dir and "
           "--validation-file are for BERT classifiers; ", o.model, " is a ", model.model_type, " model",
           model.is_causal_lm() ? " (score text with --data FILE)" : "");
  Params params = plan.shard(model.params);
  json result = model.config.holds<models::VisionEncoderDecoderConfig>() ? eval_captioner(deployer, model, params, o)
                : model.config.holds<models::VitConfig>()                    ? eval_image_classifier(deployer, model, params, o)
                : model.is_causal_lm()                                       ? eval_decoder(deployer, model, params, o)
                                                                             : eval_glue(deployer, model, params, o);
  result["model"] = o.model;
  if (!deployer.is_main()) return;
  std::cout << result.dump(2) << "\n";
  if (!o.output.empty()) io::write_file_atomic(o.output, result.dump(2) + "\n");
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval", "evaluate a checkpoint or model directory on a dataset");
  cmd->add_option("--model", o->model, "meshtrain run/checkpoint directory or Hugging Face model directory")
      ->required()
      ->check(CLI::ExistingPath);
  add_allow_new_heads_flag(cmd, o->allow_new_heads);
  add_adapter_flag(cmd, o->adapter);
  cmd->add_option("--data", o->data.data, "decoders: text file or directory scored by loss and perplexity; "
                  "image-to-text models: captions (JSON lines {image, caption} or COCO captions JSON)")
      ->capture_default_str();
  cmd->add_option("--seq-len", o->data.seq_len, "decoders: tokens per scored sequence (default: the model's context)")
      ->check(integer_range(2, 1 << 20));
  cmd->add_option("--task", o->task, "BERT classifiers: GLUE task");
  cmd->add_option("--data-dir", o->data_dir, "BERT classifiers: GLUE root or task directory");
  cmd->add_option("--split", o->split, "GLUE split (default: dev, dev_matched for MNLI)");
  cmd->add_option("--validation-file,--validation_file", o->validation_file,
                  "BERT classifiers: your CSV / JSON-lines rows (as glue --validation-file), classes from the model's id2label")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-eval-samples", o->max_eval_samples, "BERT classifiers: use the first N rows");
  cmd->add_option("--max-seq-length", o->max_seq_length, "BERT classifiers: tokens per example")->capture_default_str();
  add_boolean_flag(cmd, "--pad-to-max-length,--pad_to_max_length", o->pad_to_max_length,
                   "BERT classifiers: true: every batch --max-seq-length long; false (default): each batch padded to "
                   "its longest row, rounded up to --pad-to-multiple-of (the same scores up to rounding)");
  cmd->add_option("--pad-to-multiple-of,--pad_to_multiple_of", o->pad_to_multiple_of,
                  "BERT classifiers: cut batch lengths are multiples of this")
      ->capture_default_str()
      ->check(integer_range(1, 4096));
  cmd->add_option("--per-device-batch-size,--per-device-eval-batch-size", o->per_device_batch_size,
                  "examples per data-parallel rank")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--output", o->output, "also write the results JSON to this file");
  cmd->add_option("--image-dir", o->image_dir, "image-to-text models: the directory --data names images in; "
                  "image classifiers: the images, one folder per class");
  cmd->add_option("--num-beams", o->num_beams, "image-to-text models: beam search width (1: greedy)")
      ->capture_default_str();
  cmd->add_option("--max-target-length", o->max_target_length, "image-to-text models: caption tokens generated at most")
      ->capture_default_str()
      ->check(positive());
  cmd->add_flag("--skip-bad-images", o->skip_bad_images, "image models: skip unreadable images (counted)");
  cmd->add_option("--predictions", o->predictions,
                  "image models: write {image, reference|label, prediction} JSON lines to this file");
  add_run_flags(cmd, o->run, false);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
