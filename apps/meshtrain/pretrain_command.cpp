// `meshtrain pretrain`: the seed tutorial's miniGPT workflow for any decoder (miniGPT,
// GPT-2, LLaMA) on any text — documents packed into fixed-length sequences (or padded one
// per example), AdamW with warmup + cosine decay, a held-out tail for eval loss, sampled
// generations from a prompt while training, checkpoints and resume, and at the end a
// Hugging Face-style model directory that `generate` and `eval` read.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/data/token_shards.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct PretrainOptions {
  LmDataFlags data;
  std::string model = "minigpt";
  std::string config;
  std::string init_from;        // continue from this model instead of fresh weights
  bool tokenizer_given = false;  // --tokenizer on the command line (else --init-from's own, or the token shards')
  LoraFlags lora;
  StepFlags length{0, 1, 16, 1};
  double learning_rate = 2e-3;
  int64_t warmup_steps = 50;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;
  double adam_epsilon = 1e-8;
  double eval_fraction = 0.02;
  int64_t eval_steps = 0;
  int64_t save_steps = 0;
  int keep_checkpoints = 3;
  int64_t sample_every = 0;
  std::string prompt = "The ";
  int64_t sample_tokens = 120;
  double temperature = 0.8;
  int64_t top_k = 40;
  RunFlags run;
};

void print_sample(const models::PretrainedModel& model, const Params& params, const tokenizers::Tokenizer& tok,
                  const PretrainOptions& o, int64_t step, const fs::path& samples_file, train::Trainer& trainer) {
  // Every rank runs the generation on the (possibly sharded) weights; rank 0 prints it.
  models::PretrainedModel m = model;
  m.params = params;
  std::string text = sample_text(m, tok, o.prompt, o.sample_tokens, o.temperature, o.top_k, o.run.seed + uint64_t(step));
  trainer.print("--- sample at step " + std::to_string(step) + " ---\n" + text + "\n---");
  if (dist::world().rank() != 0) return;
  std::ofstream(samples_file, std::ios::app) << "=== step " << step << "\n" << text << "\n";
}

void run(const PretrainOptions& o) {
  check_output_dir(o.run, "pretrain");
  train::arm_stop_request();  // Ctrl-C: stop after the step, checkpoint, exit 130
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  const fs::path out = o.run.output_dir, model_dir = out / "model";
  models::PretrainedOptions po;
  po.init_key = deployer.init_key();
  po.load_tokenizer = false;
  po.print_report = deployer.is_main();
  std::shared_ptr<models::PretrainedModel> model;
  if (!o.init_from.empty()) {  // before any file is written: a bad model fails here
    model = std::make_shared<models::PretrainedModel>(
        train::is_checkpoint_path(o.init_from) ? train::load_checkpoint_model(o.init_from, dist::Mesh::single(), po)
                                               : models::from_pretrained(o.init_from, po));
    MT_CHECK(model->is_causal_lm(), "[pretrain] --init-from ", o.init_from, ": model_type '", model->model_type,
             "' is not a decoder");
    if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());
  } else {
    MT_CHECK(!o.lora.enabled(), "[pretrain] LoRA adapts a trained model: pass --init-from DIR with --lora-rank");
  }
  LmDataFlags data = o.data;
  if (!o.tokenizer_given) {
    if (!o.init_from.empty()) data.tokenizer = o.init_from;  // the model's own tokenizer
    else if (data::is_token_shard_dir(data.data)) data.tokenizer = (fs::path(data.data) / "tokenizer").string();  // prepare-data's
  }
  LmCorpus corpus = load_lm_corpus(data, model_dir.string(), o.eval_fraction);
  if (model) {
    const models::CausalLm lm = model->causal_lm();
    MT_CHECK(lm.vocab_size >= corpus.tokenizer->vocab_size(), "[pretrain] --init-from ", o.init_from, " has ",
             lm.vocab_size, " token ids, fewer than the tokenizer's ", corpus.tokenizer->vocab_size());
    MT_CHECK(lm.max_positions == 0 || lm.max_positions >= o.data.seq_len, "[pretrain] --seq-len ", o.data.seq_len,
             " exceeds the ", lm.max_positions, " positions of ", o.init_from);
  } else {
    json config = decoder_config(o.model, o.config, corpus.tokenizer->vocab_size(), o.data.seq_len, corpus.eos_id);
    model = std::make_shared<models::PretrainedModel>(models::init_model(config, po));
  }
  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);

  std::shared_ptr<const data::Dataset> train_set = corpus.dataset, eval_set = corpus.eval_dataset;
  const int64_t n_eval = eval_set ? eval_set->size() : 0;
  const int64_t global_batch = o.length.per_device_batch_size * deployer.data_size();
  // The schedule's length is the Trainer's own step count.
  train::FitOptions f;
  const int64_t total = plan_fit(o.length, train_set->size(), deployer, f);

  deployer.log("pretrain: " + model->model_type + (o.init_from.empty() ? "" : " from " + o.init_from) +
               (o.lora.enabled() ? " with LoRA rank " + std::to_string(o.lora.rank) : "") + " (" +
               std::to_string(model->params.total_elements()) + " parameters) on " + o.data.data + ": " + std::to_string(corpus.num_tokens) + " tokens, " +
               std::to_string(train_set->size()) + " train / " + std::to_string(n_eval) + " eval sequences of " +
               std::to_string(o.data.seq_len) + (corpus.held_out.empty() ? "" : " (held out: " + corpus.held_out + ")") + "; " + std::to_string(total) + " steps of " +
               std::to_string(global_batch * o.length.grad_accum) + " sequences on mesh " + deployer.mesh().str() + ", " +
               "precision " + o.run.precision);

  const int64_t span = schedule_steps(o.run, total);
  const int64_t warmup = fitting_warmup(o.warmup_steps, span, "pretrain");
  optim::Schedule lr = optim::warmup_cosine_decay_schedule(0.0, o.learning_rate, warmup, span, o.learning_rate * 0.1);
  optim::Transform adamw = optim::adamw(lr, 0.9, 0.95, o.adam_epsilon, o.weight_decay);
  optim::Transform opt = optim::chain({gradient_clipping(o.max_grad_norm),
                                       o.lora.enabled() ? lora_optimizer(adamw) : adamw});
  // Moved: the trainer holds the only handles, so each step updates the parameters in place
  // and a sharded plan keeps no unsharded copy beside its shards.
  train::Trainer trainer(deployer, lm_collate(), lm_loss(model), std::move(model->params), opt, plan);

  f.eval_data = eval_set;
  f.eval_every = o.eval_steps;
  f.save_every = o.save_steps;
  f.keep_last = o.keep_checkpoints;
  apply_run_flags(o.run, f);
  f.checkpoint_extra = train::checkpoint_model_extra(model->config_json(), "../../model", model->config.lora());
  f.checkpoint_extra["schedule_steps"] = span;
  f.learning_rate = lr;
  f.tokens_per_example = o.data.seq_len;
  const fs::path samples = out / "samples.txt";
  if (o.sample_every > 0)
    f.on_step = [&](int64_t step, const Params& p) {
      if (step % o.sample_every == 0 && step < total) print_sample(*model, p, *corpus.tokenizer, o, step, samples, trainer);
    };
  // One sample before training shows where the model starts (fresh: noise; --init-from:
  // the model's own text).
  if (!o.run.resume && !o.run.dry_run) print_sample(*model, trainer.params(), *corpus.tokenizer, o, 0, samples, trainer);
  train::FitResult r = trainer.fit(train_set, f);
  trainer.release_optimizer_state();  // the export below gathers the weights into its memory

  // The final model as a Hugging Face-style directory beside the tokenizer files.
  if (o.lora.enabled()) model->params = gathered_params(trainer, deployer);  // the merge and the adapter
  export_model(trainer, deployer, *model, model_dir.string(), dtype_from_name(o.run.save_dtype));  // LoRA: merged
  if (deployer.is_main() && o.lora.enabled()) models::save_adapter(*model, (out / "adapter").string(), o.init_from);
  if (!r.evals.empty() && r.evals.back().count("eval_loss"))
    deployer.log("eval perplexity " + std::to_string(train::perplexity(r.evals.back().at("eval_loss"))));
  print_sample(*model, trainer.params(), *corpus.tokenizer, o, trainer.step(), samples, trainer);
  deployer.log("checkpoints in " + (out / "checkpoints").string() + ", model in " + model_dir.string() +
               ", metrics in " + (out / "metrics.jsonl").string() + ", curves in " + (out / "curves.svg").string());
}

}  // namespace

void add_pretrain_command(CLI::App& app) {
  auto o = std::make_shared<PretrainOptions>();
  o->run.output_dir = "runs/pretrain";
  std::string names;
  for (const models::ModelSpec* spec : models::model_specs(models::ModelKind::decoder))
    names += (names.empty() ? "" : ", ") + spec->display_name;
  CLI::App* cmd = app.add_subcommand("pretrain", "train a decoder language model (" + names + ") on text");
  add_lm_data_flags(cmd, o->data);
  cmd->add_option("--model", o->model,
                  "architecture: " + models::model_types_text(models::ModelKind::decoder) + " (a small default size)")
      ->capture_default_str()
      ->check(CLI::IsMember(models::model_types(models::ModelKind::decoder)));
  cmd->add_option("--config", o->config, "config.json whose keys override the default size (e.g. n_layer)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--init-from", o->init_from,
                  "continue training this model (HF directory, meshtrain run/checkpoint or llama2.c .bin); its "
                  "tokenizer unless --tokenizer");
  add_lora_flags(cmd, o->lora);
  add_step_flags(cmd, o->length);
  cmd->add_option("--learning-rate", o->learning_rate, "peak learning rate (AdamW, warmup then cosine to 10%)")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", o->warmup_steps, "linear warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW weight decay (not on biases and norms)")->capture_default_str();
  cmd->add_option("--adam-epsilon", o->adam_epsilon, "AdamW epsilon")->capture_default_str();
  add_max_grad_norm_flag(cmd, o->max_grad_norm);
  cmd->add_option("--eval-fraction", o->eval_fraction, "share held out for eval loss (0: none): every (1/fraction)-th document of a corpus of many, else the last sequences")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  cmd->add_option("--eval-steps", o->eval_steps, "evaluate every N steps (0: each epoch)")->capture_default_str();
  cmd->add_option("--save-steps", o->save_steps, "checkpoint every N steps (0: only the last)")->capture_default_str();
  cmd->add_option("--keep-checkpoints", o->keep_checkpoints, "newest step checkpoints kept")->capture_default_str();
  cmd->add_option("--sample-every", o->sample_every, "print a sampled generation every N steps (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--prompt", o->prompt, "prompt of the sampled generations")->capture_default_str();
  cmd->add_option("--sample-tokens", o->sample_tokens, "tokens per sample")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  add_run_flags(cmd, o->run, true);
  cmd->callback([o, cmd] {
    o->tokenizer_given = cmd->get_option("--tokenizer")->count() > 0;
    MT_CHECK(o->init_from.empty() || (cmd->get_option("--model")->count() == 0 && o->config.empty()),
             "[pretrain] --init-from takes the model's own architecture and size: drop --model/--config");
    run(*o);
  });
}

}  // namespace mt::cli
