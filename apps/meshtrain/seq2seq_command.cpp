// `meshtrain seq2seq`: an encoder-decoder (T5 or BART: a Hugging Face directory, or a small
// model from --config small-t5|small-bart|FILE) trained on JSONL source/target pairs with
// teacher forcing, evaluated each epoch by beam search through the Predictor (ROUGE-1/2/L/
// Lsum, exact match and token accuracy), keeping the best checkpoint by ROUGE-L; writes predictions.jsonl
// and eval_results.json, and the final model as a Hugging Face directory. With --lora-rank
// only LoRA adapters train (PEFT's q/v defaults for T5 and BART) and the adapter is saved in
// PEFT's layout.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/eval_outputs.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/io/json.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/data/jsonl_reader.h"
#include "meshtrain/models/user_config.h"
#include "meshtrain/optim/partition.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/rouge.h"
#include "meshtrain/train/seq2seq_task.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Seq2SeqOptions {
  std::string model, config, tokenizer, data, eval_data;
  std::string source_field = "source", target_field = "target", source_prefix;
  bool pad_to_max_length = false;
  int64_t max_source_length = 128, max_target_length = 64;
  int64_t num_beams = 4;
  double length_penalty = 1.0;
  int64_t no_repeat_ngram_size = 0;
  bool use_stemmer = true;
  StepFlags length{0, 3, 8, 1};
  AdamWFlags adamw{1e-3};
  LoraFlags lora;
  RunFlags run;
};

std::optional<int64_t> pad_id(const tokenizers::Tokenizer& tok) {
  for (const char* n : {"<pad>", "[PAD]"})
    if (auto id = tok.token_to_id(n)) return *id;
  return std::nullopt;
}

struct Pairs {
  std::vector<std::string> sources, targets;
};

// The rows' source and target texts; a missing field names file:line (read_jsonl), an empty
// target names its row.
Pairs read_pairs(const std::string& path, const Seq2SeqOptions& o) {
  Pairs p;
  for (const data::Example& e : data::read_jsonl(path, {.columns = {o.source_field, o.target_field}})) {
    const auto* s = std::get_if<std::string>(e.find(o.source_field));
    const auto* t = std::get_if<std::string>(e.find(o.target_field));
    const size_t row = p.sources.size() + 1;
    MT_CHECK(s && t, "[seq2seq] ", path, ": row ", row, ": fields '", o.source_field, "' and '", o.target_field,
             "' must be strings");
    MT_CHECK(!t->empty(), "[seq2seq] ", path, ": row ", row, " has an empty target ('", o.target_field, "')");
    MT_CHECK(!s->empty(), "[seq2seq] ", path, ": row ", row, " has an empty source ('", o.source_field, "')");
    p.sources.push_back(*s), p.targets.push_back(*t);
  }
  MT_CHECK(!p.sources.empty(), "[seq2seq] ", path, " has no rows");
  return p;
}

std::shared_ptr<const data::Dataset> tokenize_pairs(const Pairs& p, const tokenizers::Tokenizer& tok,
                                                    const train::Seq2SeqTokens& t) {
  std::vector<data::Example> rows;
  for (size_t i = 0; i < p.sources.size(); ++i) rows.push_back(train::seq2seq_example(tok, p.sources[i], p.targets[i], t));
  return data::make_dataset(std::move(rows));
}

void run(const Seq2SeqOptions& o) {
  MT_CHECK(o.num_beams >= 1, "[seq2seq] --num-beams must be >= 1, got ", o.num_beams);
  MT_CHECK(o.model.empty() != o.config.empty(), "[seq2seq] pass exactly one of --model DIR and --config "
           "small-t5|small-bart|FILE");
  check_output_dir(o.run, "seq2seq");
  train::arm_stop_request();  // Ctrl-C: stop after the step, checkpoint, exit 130
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  const fs::path out = o.run.output_dir;

  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  po.load_tokenizer = o.tokenizer.empty() && !o.model.empty();
  std::shared_ptr<models::PretrainedModel> model;
  std::shared_ptr<tokenizers::Tokenizer> tok = o.tokenizer.empty() ? nullptr : tokenizers::load_tokenizer(o.tokenizer);
  if (!o.model.empty()) {
    model = std::make_shared<models::PretrainedModel>(models::from_pretrained(o.model, po));
    if (!tok) tok = model->tokenizer;
  } else {
    MT_CHECK(tok != nullptr, "[seq2seq] --config needs --tokenizer PATH (the vocabulary sets the model's size)");
    const auto pad = pad_id(*tok), eos = end_of_text_id(*tok);
    MT_CHECK(pad, "[seq2seq] ", o.tokenizer, " has no pad token (<pad> or [PAD]); an encoder-decoder needs one");
    MT_CHECK(eos, "[seq2seq] ", o.tokenizer, " has no end token (</s>, [SEP] or <|endoftext|>)");
    json config;
    if (o.config.rfind("small-", 0) == 0) {
      // small-<type> for every registered encoder-decoder.
      const std::string type = o.config.substr(6);
      const std::vector<std::string> kinds = models::model_types(models::ModelKind::seq2seq);
      std::string choices;
      for (const std::string& k : kinds) choices += "small-" + k + ", ";
      MT_CHECK(std::find(kinds.begin(), kinds.end(), type) != kinds.end(), "[seq2seq] unknown --config '", o.config,
               "' (", choices, "or a config.json)");
      config = models::model_spec(type).small_seq2seq_config(tok->vocab_size(), *pad, *eos);
    } else {
      const json user = io::read_json_file(o.config);
      MT_CHECK(user.is_object() && user.contains("model_type") && user["model_type"].is_string(), "[seq2seq] ",
               o.config, ": a config.json needs a model_type (", models::model_types_text(models::ModelKind::seq2seq),
               ")");
      config = models::merge_user_config(models::model_spec(user["model_type"].get<std::string>()), json::object(), user,
                                         o.config, "seq2seq");
    }
    po.new_params = models::NewParams::all;
    po.init_key = deployer.init_key();
    model = std::make_shared<models::PretrainedModel>(models::init_model(config, po));
  }
  MT_CHECK(model->is_seq2seq(), "[seq2seq] ", o.model.empty() ? o.config : o.model, ": model_type '",
           model->model_type, "' is not an encoder-decoder (use ", models::model_types_text(models::ModelKind::seq2seq),
           ")");
  MT_CHECK(tok != nullptr, "[seq2seq] ", o.model, " has no tokenizer: pass --tokenizer PATH");
  const models::Seq2SeqLm lm = model->seq2seq_lm();
  train::Seq2SeqTokens t{lm.pad_token_id, lm.eos_token_id, lm.decoder_start_token_id, o.max_source_length,
                         o.max_target_length, o.source_prefix};
  t.pad_to_max_length = o.pad_to_max_length;
  const Pairs train_pairs = read_pairs(o.data, o), eval_pairs = read_pairs(o.eval_data, o);
  auto train_set = tokenize_pairs(train_pairs, *tok, t), eval_set = tokenize_pairs(eval_pairs, *tok, t);
  if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());

  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);
  train::FitOptions f;
  const int64_t total = plan_fit(o.length, train_set->size(), deployer, f);
  const int64_t span = schedule_steps(o.run, total);
  const WarmupCosineAdamW adamw = warmup_cosine_adamw(o.adamw, span, "seq2seq", lora_wrap(o.lora));
  const optim::Schedule lr = adamw.learning_rate;
  optim::Transform opt = adamw.optimizer;
  // HF buffers (BART's final_logits_bias) are saved but never trained (LoRA freezes them
  // with the rest of the base).
  std::string buffers;
  for (const std::string& b : model->spec().buffers) buffers += (buffers.empty() ? "" : "|") + b;
  if (!buffers.empty() && !o.lora.enabled()) opt = optim::partition({{buffers, optim::freeze()}, {".*", opt}});
  int64_t trainable = 0;
  for (const auto& [path, p] : optim::split_frozen(opt, model->params).first) trainable += p.numel();
  deployer.log("seq2seq: " + model->model_type + " (" +
               (o.lora.enabled() ? "LoRA rank " + std::to_string(o.lora.rank) + ", " : std::string()) +
               std::to_string(trainable) + " of " + std::to_string(model->params.total_elements()) +
               " parameters trained) on " + o.data + ": " + std::to_string(train_set->size()) + " train / " +
               std::to_string(eval_set->size()) + " eval pairs, " + std::to_string(total) + " steps of " +
               std::to_string(o.length.per_device_batch_size * deployer.data_size() * o.length.grad_accum) +
               " on mesh " + deployer.mesh().str() + ", beam search with " + std::to_string(o.num_beams) + " beams");

  std::shared_ptr<const models::PretrainedModel> frozen_model = model;
  train::CollateFn collate = train::seq2seq_collate(t);
  // Moved: the trainer holds the only handles (updates in place; no unsharded copy kept).
  train::Trainer trainer(deployer, collate, train::seq2seq_loss_fn(frozen_model), std::move(model->params), opt, plan);
  // Data ranks' slices, each padded to its own longest rows, are padded to the ranks' longest.
  if (!t.pad_to_max_length) trainer.set_padded_fields(train::seq2seq_padded_fields(t));

  models::GenerationConfig g;
  g.max_new_tokens = o.max_target_length;
  g.num_beams = o.num_beams, g.length_penalty = o.length_penalty, g.no_repeat_ngram_size = o.no_repeat_ngram_size;
  g.pad_token_id = lm.pad_token_id;
  train::Predictor<std::vector<int64_t>> predictor(
      deployer, collate, train::seq2seq_predict_fn(frozen_model, g, tok->vocab_size()),
      [](const train::Batch& host) { return train::unpack_token_rows(host["tokens"]); });
  if (!t.pad_to_max_length) predictor.set_padded_fields(train::seq2seq_padded_fields(t));
  std::vector<std::string> last_predictions;
  // The targets' ids as the model should produce them: the eval rows' labels without the
  // end token.
  std::vector<std::vector<int64_t>> target_ids;
  for (int64_t i = 0; i < eval_set->size(); ++i) {
    target_ids.push_back(eval_set->get(i).tokens("labels"));
    target_ids.back().pop_back();
  }
  auto evaluate = [&](const Params& p) {
    std::vector<std::string> predictions;
    std::vector<std::vector<int64_t>> predicted_ids;
    for (const auto& ids : predictor.predict(p, eval_set, o.length.per_device_batch_size)) {
      std::vector<int32_t> keep;
      predicted_ids.emplace_back();
      for (int64_t id : ids)
        if (id != lm.eos_token_id && id != lm.pad_token_id) keep.push_back(int32_t(id)), predicted_ids.back().push_back(id);
      predictions.push_back(tok->decode(keep, true));
    }
    const train::RougeScores r = train::mean_rouge(eval_pairs.targets, predictions, o.use_stemmer);
    int64_t exact = 0;
    for (size_t i = 0; i < predictions.size(); ++i) exact += predictions[i] == eval_pairs.targets[i];
    last_predictions = predictions;
    return std::map<std::string, double>{{"rouge1", r.rouge1.fmeasure},
                                         {"rouge2", r.rouge2.fmeasure},
                                         {"rougeL", r.rougeL.fmeasure},
                                         {"rougeLsum", r.rougeLsum.fmeasure},
                                         {"exact_match", double(exact) / double(predictions.size())},
                                         {"token_accuracy", train::token_accuracy(target_ids, predicted_ids)}};
  };
  f.eval_fn = evaluate;
  f.save_best_by = "max:rougeL";
  apply_run_flags(o.run, f);
  // The tokenizer travels with the run's model/ folder, which a LoRA run without
  // --merge-lora does not write.
  const std::string tokenizer_source = o.tokenizer.empty() ? model->source : o.tokenizer;
  const std::string tokenizer_ref =
      o.lora.enabled() && !o.lora.merge ? fs::absolute(tokenizer_source).string() : "../../model";
  f.checkpoint_extra = train::checkpoint_model_extra(model->config_json(), tokenizer_ref, model->config.lora());
  f.checkpoint_extra["schedule_steps"] = span;
  f.learning_rate = lr;
  // Padded to their longest rows, batches have no fixed token count: the rate is in examples.
  f.tokens_per_example = t.pad_to_max_length ? o.max_source_length + o.max_target_length : 0;
  train::FitResult r = trainer.fit(train_set, f);
  if (!save_trained_weights(trainer, *model, o.lora, o.model.empty() ? o.config : o.model, tokenizer_source, o.run,
                            deployer))
    return;
  std::vector<json> rows;
  for (size_t i = 0; i < last_predictions.size(); ++i)
    rows.push_back({{"source", eval_pairs.sources[i]}, {"target", eval_pairs.targets[i]}, {"prediction", last_predictions[i]}});
  write_eval_outputs(out, rows, trainer.step(), r);
}

}  // namespace

void add_seq2seq_command(CLI::App& app) {
  auto o = std::make_shared<Seq2SeqOptions>();
  o->run.output_dir = "runs/seq2seq";
  CLI::App* cmd = app.add_subcommand(
      "seq2seq", "train an encoder-decoder (T5, BART) on source/target pairs, evaluated with beam search and ROUGE");
  cmd->add_option("--model", o->model, "Hugging Face T5 or BART directory to start from");
  cmd->add_option("--config", o->config, "train from scratch: small-t5, small-bart or a config.json");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file or directory (default: the model directory's)");
  cmd->add_option("--data", o->data, "training pairs (JSONL)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--eval-data", o->eval_data, "evaluation pairs (JSONL)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--source-field", o->source_field, "JSONL key of the source text")->capture_default_str();
  cmd->add_option("--target-field", o->target_field, "JSONL key of the target text")->capture_default_str();
  cmd->add_option("--source-prefix", o->source_prefix, "prepended to each source (e.g. \"summarize: \")");
  add_boolean_flag(cmd, "--pad-to-max-length,--pad_to_max_length", o->pad_to_max_length,
                   "pad every batch to --max-source-length and --max-target-length, not to its longest rows (data "
                   "ranks then pad their slices to the ranks' longest)");
  cmd->add_option("--max-source-length", o->max_source_length, "source tokens kept (with the end token)")
      ->capture_default_str()->check(positive());
  cmd->add_option("--max-target-length", o->max_target_length, "target tokens kept, and generated at most")
      ->capture_default_str()->check(positive());
  cmd->add_option("--num-beams", o->num_beams, "beam search width in evaluation (1: greedy)")->capture_default_str();
  cmd->add_option("--length-penalty", o->length_penalty, "beam scores divide by length^this")->capture_default_str();
  cmd->add_option("--no-repeat-ngram-size", o->no_repeat_ngram_size, "ban repeated n-grams of this size (0: off)")
      ->capture_default_str();
  cmd->add_flag("!--no-stemmer", o->use_stemmer, "ROUGE without the Porter stemmer");
  add_step_flags(cmd, o->length);
  add_adamw_flags(cmd, o->adamw);
  add_lora_flags(cmd, o->lora);
  add_run_flags(cmd, o->run, true);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
