// `meshtrain eval`: scores a model — a meshtrain run or checkpoint directory, or a Hugging
// Face directory — on a dataset. Decoders: token-weighted mean loss and perplexity over
// every sequence of a text file (the last batch padded, its padding dropped). BERT
// classifiers: the GLUE task's metrics on a split. Prints JSON and, with --output, writes it.
#include <algorithm>
#include <cmath>
#include <iostream>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/glue_setup.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/data/classification_files.h"
#include "meshtrain/io/mapped_file.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/reduce.h"
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
  int64_t per_device_batch_size = 8;
  int64_t max_eval_samples = -1;
  std::string output;
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
  data::GlueTask task;
  std::vector<data::Example> rows;
  std::string split = o.validation_file;
  if (!o.validation_file.empty()) {
    // The classes are the model's id2label (numbered 0..n-1 when it has only placeholders).
    const models::BertConfig& c = model.config.as<models::BertConfig>();
    std::vector<std::string> classes = c.label_names;
    if (classes.empty() && c.num_labels > 1)
      for (int64_t i = 0; i < c.num_labels; ++i) classes.push_back(std::to_string(i));
    task = data::classification_task(o.validation_file, classes);
    rows = data::read_classification_rows(o.validation_file, task);
  } else {
    MT_CHECK(!o.task.empty() && !o.data_dir.empty(), "[eval] a BERT classifier is evaluated on a GLUE task (--task and "
             "--data-dir) or on your rows (--validation-file)");
    task = data::glue_task(o.task);
    split = o.split.empty() ? task.dev_split : o.split;
    rows = data::read_glue_split(o.data_dir, task, split);
  }
  if (o.max_eval_samples >= 0 && int64_t(rows.size()) > o.max_eval_samples) rows.resize(size_t(o.max_eval_samples));
  auto dataset = data::make_dataset(std::move(rows));
  auto tok = model.tokenizer;
  glue_fixed_length(*tok, o.max_seq_length);
  json result = {{"task", task.name}, {"split", split}, {"examples", dataset->size()}};
  for (const auto& [k, v] : glue_evaluate(deployer, model, params, task, glue_collate(tok, task, o.max_seq_length), dataset,
                                          o.per_device_batch_size))
    result["eval_" + k] = v;
  return result;
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
  Params params = plan.shard(model.params);
  json result = model.is_causal_lm() ? eval_decoder(deployer, model, params, o) : eval_glue(deployer, model, params, o);
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
  cmd->add_option("--data", o->data.data, "decoders: text file or directory scored by loss and perplexity")
      ->capture_default_str();
  cmd->add_option("--seq-len", o->data.seq_len, "decoders: tokens per scored sequence (default: the model's context)")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--task", o->task, "BERT classifiers: GLUE task");
  cmd->add_option("--data-dir", o->data_dir, "BERT classifiers: GLUE root or task directory");
  cmd->add_option("--split", o->split, "GLUE split (default: dev, dev_matched for MNLI)");
  cmd->add_option("--validation-file,--validation_file", o->validation_file,
                  "BERT classifiers: your CSV / JSON-lines rows (as glue --validation-file), classes from the model's id2label")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-eval-samples", o->max_eval_samples, "BERT classifiers: use the first N rows");
  cmd->add_option("--max-seq-length", o->max_seq_length, "BERT classifiers: tokens per example")->capture_default_str();
  cmd->add_option("--per-device-batch-size", o->per_device_batch_size, "examples per data-parallel rank")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--output", o->output, "also write the results JSON to this file");
  add_run_flags(cmd, o->run, false);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
