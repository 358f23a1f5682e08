// `meshtrain glue`: BERT fine-tuning on a GLUE task with the options of Hugging Face's
// run_flax_glue (AdamW, linear warmup and decay, weight decay off biases and LayerNorm),
// from a pretrained directory or a small BERT trained from scratch. Prints one
// "epoch | train loss | eval metrics" line per epoch and writes metrics.jsonl, TensorBoard
// events, eval_results.json, the best checkpoint by the task's metric and the final model.
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <iostream>
#include <optional>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/glue_setup.h"
#include "apps/meshtrain/glue_token_cache.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/data/classification_files.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/optim/schedule.h"
#include "meshtrain/optim/transform.h"
#include "meshtrain/train/checkpoint_model.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct GlueOptions {
  std::string task, model, config, tokenizer, data_dir;
  std::string train_file, validation_file;  // a user's own data instead of a GLUE task
  int64_t max_seq_length = 128;
  bool pad_to_max_length = true;
  int64_t pad_to_multiple_of = 8;
  bool pad_to_multiple_of_given = false;  // it has no effect at --pad_to_max_length true: said
  double learning_rate = 5e-5;
  int64_t num_train_epochs = 3;
  int64_t max_steps = -1;
  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;
  int64_t eval_steps = 0;
  int64_t save_steps = 0;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  int64_t max_train_samples = -1, max_eval_samples = -1;
  bool allow_new_heads = false;
  bool no_token_cache = false;
  LoraFlags lora;
  RunFlags run;
};

std::shared_ptr<const data::Dataset> limited(std::vector<data::Example> rows, int64_t limit, const std::string& what) {
  if (limit >= 0 && int64_t(rows.size()) > limit) rows.resize(size_t(limit));
  MT_CHECK(!rows.empty(), "[glue] ", what, " has no rows");
  return data::make_dataset(std::move(rows));
}

struct GlueData {
  data::GlueTask task;
  std::shared_ptr<const data::Dataset> train, eval;
};

// A GLUE task's train and dev splits, or the user's --train_file / --validation_file.
GlueData load_data(const GlueOptions& o) {
  GlueData d;
  if (!o.train_file.empty()) {
    data::ClassificationFiles files = data::read_classification_files(o.train_file, o.validation_file);
    d.task = files.task;
    d.train = limited(std::move(files.train), o.max_train_samples, o.train_file);
    d.eval = limited(std::move(files.validation), o.max_eval_samples, o.validation_file);
    return d;
  }
  d.task = data::glue_task(o.task);
  d.train = limited(data::read_glue_split(o.data_dir, d.task, "train"), o.max_train_samples, d.task.name + " train");
  d.eval = limited(data::read_glue_split(o.data_dir, d.task, d.task.dev_split), o.max_eval_samples,
                   d.task.name + " " + d.task.dev_split);
  return d;
}

void run(const GlueOptions& o) {
  check_output_dir(o.run, "glue");
  train::arm_stop_request();  // Ctrl-C: stop after the step, checkpoint, exit 130
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  const fs::path out = o.run.output_dir, model_dir = out / "model";
  const GlueData glue_data = load_data(o);
  const data::GlueTask& task = glue_data.task;

  // The model and its tokenizer (kept in <output-dir>/model so checkpoints carry it).
  MT_CHECK(!o.model.empty() || !o.tokenizer.empty(), "[glue] training from --config needs --tokenizer (e.g. a BERT vocab.txt)");
  auto tok = tokenizer_into(o.tokenizer.empty() ? o.model : o.tokenizer, model_dir.string());
  models::PretrainedOptions po;
  po.bert_head = models::BertHead::sequence_classification;
  po.num_labels = task.num_labels();
  if (task.name == "custom") po.label_names = task.label_names;  // config.json's id2label
  po.init_key = deployer.init_key();
  po.load_tokenizer = false;
  po.print_report = deployer.is_main();
  // The classifier (and a pooler a masked-LM checkpoint lacks) start new; anything else
  // missing is an error unless --allow-new-heads.
  po.new_params = o.allow_new_heads ? models::NewParams::all : models::NewParams::heads;
  auto model = std::make_shared<models::PretrainedModel>(
      o.model.empty() ? models::init_model(small_bert_config(o.config, task, tok->vocab_size(), o.max_seq_length), po)
                      : models::from_pretrained(o.model, po));
  MT_CHECK(model->config.holds<models::BertConfig>(), "[glue] ", o.model, " is a ", model->model_type,
           " model; glue fine-tunes BERT");
  if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());
  const int64_t positions = model->config.as<models::BertConfig>().max_position_embeddings;
  const int64_t max_len = length_within_positions(o.max_seq_length, positions, "--max-seq-length", o.model, deployer, "glue");
  glue_fixed_length(*tok, max_len);
  // --pad_to_max_length false: each batch as long as its longest row (rounded up), not
  // --max-seq-length; the train batches' lengths are reported at the end.
  const int64_t pad_multiple = o.pad_to_max_length || o.run.dry_run ? 0 : o.pad_to_multiple_of;  // --dry-run: full length
  if (o.pad_to_max_length && o.pad_to_multiple_of_given)
    deployer.log("glue: --pad-to-multiple-of has no effect while --pad_to_max_length is true (every batch is " +
                 std::to_string(max_len) + " long); add --pad_to_max_length false");
  auto train_lengths = std::make_shared<CollatedLengths>();
  train::CollateFn collate = glue_collate(tok, task, max_len, pad_multiple, train_lengths);
  train::CollateFn eval_collate = glue_collate(tok, task, max_len, pad_multiple);
  // Every row tokenized once, before the first step (and read back from the cache beside the
  // data on the next run), not in each batch of each epoch and evaluation.
  const std::string cache_dir =
      o.no_token_cache ? std::string()
                       : token_cache_dir(o.train_file.empty() ? data::glue_task_dir(o.data_dir, task)
                                                              : fs::absolute(o.train_file).parent_path().string());
  std::shared_ptr<const data::Dataset> train_set, eval_set;
  {
    TokenCacheReport tr, er;
    train_set = pretokenize_glue(glue_data.train, *tok, task, max_len, model_dir.string(), cache_dir,
                                 task.name + "-train", &tr);
    eval_set = pretokenize_glue(glue_data.eval, *tok, task, max_len, model_dir.string(), cache_dir,
                                task.name + "-eval", &er);
    std::ostringstream line;
    line << std::fixed << std::setprecision(2) << "glue: " << train_set->size() + eval_set->size() << " rows "
         << (tr.from_cache && er.from_cache ? "read from the token cache" : "tokenized") << " in " << tr.seconds + er.seconds
         << " s" << (tr.path.empty() ? std::string(" (no cache)") : " (" + fs::path(tr.path).parent_path().string() + ")");
    deployer.log(line.str());
  }
  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);

  const int64_t global_batch = o.per_device_train_batch_size * deployer.data_size();
  // The schedule's length is the Trainer's own step count.
  train::FitOptions f;
  f.per_device_batch_size = o.per_device_train_batch_size;
  f.epochs = o.num_train_epochs;
  f.max_steps = o.max_steps > 0 ? o.max_steps : -1;
  const int64_t total = train::plan_steps(train_set->size(), f, deployer).total_steps;
  const int64_t span = schedule_steps(o.run, total);
  const int64_t warmup = fitting_warmup(o.warmup_steps, span, "glue");
  optim::Schedule lr = optim::warmup_linear_decay_schedule(o.learning_rate, warmup, span);
  optim::Transform opt = optim::adamw(lr, 0.9, 0.999, 1e-6, o.weight_decay);
  // LoRA: the adapters and the new task head (classifier, pooler) train, the encoder is frozen.
  if (o.lora.enabled()) opt = lora_optimizer(opt, R"((classifier|bert\.pooler)\..*)");  // = adapter's modules_to_save
  deployer.log("glue " + (o.train_file.empty() ? task.name : o.train_file) + ": " + std::to_string(train_set->size()) + " train / " +
               std::to_string(eval_set->size()) + " eval rows, " + std::to_string(model->params.total_elements()) +
               " parameters, " + std::to_string(total) + " steps of " + std::to_string(global_batch) + " on mesh " +
               deployer.mesh().str() + ", " + "precision " + o.run.precision);
  // Moved: the trainer holds the only handles, so each step updates the parameters in place
  // and a sharded plan keeps no unsharded copy beside its shards.
  train::Trainer trainer(deployer, collate, glue_loss(model, task), std::move(model->params), opt, plan);
  if (pad_multiple > 0) trainer.set_padded_fields(glue_padded_fields(*tok));

  const std::string primary = glue_primary_metric(task);
  f.per_device_eval_batch_size = o.per_device_eval_batch_size;
  f.eval_every = o.eval_steps;
  // One predictor for the run: its captured step (on a GPU) replays at every evaluation while
  // the parameters stay where they are.
  std::optional<train::Predictor<double>> predictor;
  f.eval_fn = [&](const Params& p) {
    if (!predictor) {
      predictor.emplace(glue_predictor(deployer, *model, task, eval_collate, f.cuda_graphs));
      if (pad_multiple > 0) predictor->set_padded_fields(glue_padded_fields(*tok));
    }
    return glue_scores(task, predictor->predict(p, eval_set, o.per_device_eval_batch_size), *eval_set);
  };
  f.save_every = o.save_steps;
  f.save_best_by = "max:" + primary;
  apply_run_flags(o.run, f);
  f.checkpoint_extra = train::checkpoint_model_extra(model->config_json(), "../../model", model->config.lora());
  f.checkpoint_extra["schedule_steps"] = span;
  f.learning_rate = lr;
  // Padded to each batch's longest row, an example has no fixed token count: the rate is in
  // examples per second then.
  f.tokens_per_example = pad_multiple > 0 ? 0 : max_len;
  train::FitResult r = trainer.fit(train_set, f);
  if (pad_multiple > 0 && train_lengths->rows > 0) {
    std::ostringstream line;
    line << std::fixed << std::setprecision(1) << "glue: train batches padded to their longest row (a multiple of "
         << pad_multiple << "): " << train_lengths->mean() << " positions per row on average as collated, of "
         << "--max-seq-length " << max_len
         << (deployer.data_size() > 1 ? " (this rank's slices, before the ranks pad to the longest among them)" : "");
    deployer.log(line.str());
  }
  trainer.release_optimizer_state();  // the export below gathers the weights into its memory

  if (o.lora.enabled()) model->params = gathered_params(trainer, deployer);  // the merge and the adapter
  export_model(trainer, deployer, *model, model_dir.string(), dtype_from_name(o.run.save_dtype));  // adapters merged
  if (!deployer.is_main()) return;
  // LoRA: the adapter with the task head it trained, as PEFT saves a SEQ_CLS adapter.
  if (o.lora.enabled())
    models::save_adapter(*model, (out / "adapter").string(), o.model.empty() ? "(trained from --config)" : o.model,
                         {"classifier", "pooler"});
  json results = {{"task", task.name}, {"step", trainer.step()}};
  if (!r.evals.empty())
    for (const auto& [k, v] : r.evals.back()) results["eval_" + k] = v;
  // No best checkpoint when the metric was never finite (a constant prediction's correlation).
  const fs::path best_meta = out / "checkpoints" / "best" / "meta.json";
  const bool has_best = fs::exists(best_meta);
  results["best"] = has_best ? io::read_json_file(best_meta.string()).value("best", json()) : json();
  io::write_file_atomic((out / "eval_results.json").string(), results.dump(2) + "\n");
  std::cout << "eval results: " << results.dump() << "\n";
  if (has_best) std::cout << "best checkpoint (" << primary << "): " << (out / "checkpoints" / "best").string() << "\n";
  else std::cout << "no best checkpoint: " << primary << " was never a finite number\n";
}

}  // namespace

void add_glue_command(CLI::App& app) {
  auto o = std::make_shared<GlueOptions>();
  o->run.seed = 42;
  // HF run_flax_glue's underscore spellings are accepted as aliases of each option.
  CLI::App* cmd = app.add_subcommand("glue", "fine-tune BERT on a GLUE task (options of HF run_flax_glue)");
  std::vector<std::string> names;
  for (const auto& t : data::all_glue_tasks()) names.push_back(t.name);
  auto* task = cmd->add_option("--task,--task_name", o->task, "GLUE task")->transform(CLI::IsMember(names, CLI::ignore_case));
  auto* data_dir = cmd->add_option("--data-dir", o->data_dir, "GLUE root (with CoLA/, SST-2/, ...) or the task's directory")
                       ->check(CLI::ExistingDirectory);
  auto* train_file = cmd->add_option("--train-file,--train_file", o->train_file,
                                     "your own data instead of a GLUE task: CSV or JSON lines with 'label' and "
                                     "sentence1/sentence2 (else the first one or two other columns)")
                         ->check(CLI::ExistingFile);
  auto* validation_file =
      cmd->add_option("--validation-file,--validation_file", o->validation_file, "the held-out rows of --train-file")
          ->check(CLI::ExistingFile);
  task->excludes(train_file);
  train_file->excludes(task)->needs(validation_file);
  validation_file->needs(train_file);
  data_dir->needs(task);
  task->needs(data_dir);
  auto* model = cmd->add_option("--model,--model_name_or_path", o->model, "pretrained BERT directory (config.json + safetensors + vocab)")
                    ->check(CLI::ExistingDirectory);
  auto* config = cmd->add_option("--config", o->config, "train from scratch: 'small' or a BERT config.json");
  model->excludes(config);
  config->excludes(model);
  add_allow_new_heads_flag(cmd, o->allow_new_heads);
  add_lora_flags(cmd, o->lora);
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file or directory (default: the model's)");
  cmd->add_option("--max-seq-length,--max_seq_length", o->max_seq_length, "tokens per example after truncation and padding")
      ->capture_default_str()
      ->check(integer_range(8, 4096));
  add_boolean_flag(cmd, "--pad-to-max-length,--pad_to_max_length", o->pad_to_max_length,
                   "true: every batch is --max-seq-length long (run_flax_glue; HF run_glue's default); false: each batch "
                   "is padded to its longest row, rounded up to --pad-to-multiple-of (HF's DataCollatorWithPadding): "
                   "fewer positions, the same results up to rounding (with dropout on, its masks fall on other "
                   "positions, as in PyTorch)");
  cmd->add_option("--pad-to-multiple-of,--pad_to_multiple_of", o->pad_to_multiple_of,
                  "with --pad_to_max_length false: batch lengths are multiples of this (fewer shapes to capture or tune)")
      ->each([o](const std::string&) { o->pad_to_multiple_of_given = true; })
      ->capture_default_str()
      ->check(integer_range(1, 4096));
  cmd->add_option("--learning-rate,--learning_rate", o->learning_rate, "peak learning rate")->capture_default_str();
  cmd->add_option("--num-train-epochs,--num_train_epochs", o->num_train_epochs, "epochs")->capture_default_str()->check(positive());
  cmd->add_option("--max-steps,--max_steps", o->max_steps, "stop after this many steps (default: all epochs)");
  cmd->add_option("--per-device-train-batch-size,--per_device_train_batch_size", o->per_device_train_batch_size, "examples per data-parallel rank")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--per-device-eval-batch-size,--per_device_eval_batch_size", o->per_device_eval_batch_size, "eval examples per rank")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--eval-steps,--eval_steps", o->eval_steps, "evaluate every N steps (0: each epoch)")->capture_default_str();
  cmd->add_option("--save-steps,--save_steps", o->save_steps, "checkpoint every N steps (0: last and best only)")->capture_default_str();
  cmd->add_option("--weight-decay,--weight_decay", o->weight_decay, "AdamW weight decay (not on biases and LayerNorm)")
      ->capture_default_str();
  cmd->add_option("--warmup-steps,--warmup_steps", o->warmup_steps, "linear warmup steps")->capture_default_str();
  cmd->add_flag("--no-token-cache", o->no_token_cache,
                "tokenize the rows again instead of reading (or writing) the token cache beside the data");
  cmd->add_option("--max-train-samples", o->max_train_samples, "use the first N training rows");
  cmd->add_option("--max-eval-samples", o->max_eval_samples, "use the first N dev rows");
  // run_flax_glue's predict split (the GLUE test rows, without labels) is not run here.
  cmd->add_option_function<int64_t>(
      "--max-predict-samples",
      [](const int64_t&) {
        throw CLI::ValidationError("--max-predict-samples", "glue evaluates on the dev rows and writes no test-split "
                                                            "predictions: use --max-eval-samples");
      },
      "(run_flax_glue's; refused: there is no predict split here)");
  o->run.output_dir = "runs/glue";
  add_run_flags(cmd, o->run, true);
  cmd->callback([o] {
    MT_CHECK(!o->model.empty() || !o->config.empty(), "[glue] pass --model DIR (pretrained) or --config small|FILE");
    MT_CHECK(!o->task.empty() || !o->train_file.empty(),
             "[glue] pass --task NAME --data-dir DIR (a GLUE task) or --train-file F --validation-file F (your data)");
    run(*o);
  });
}

}  // namespace mt::cli
