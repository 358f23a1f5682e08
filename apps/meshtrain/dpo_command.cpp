// `meshtrain dpo`: preference tuning of a decoder (Hugging Face directory, meshtrain run or
// llama2.c file) on rows of a prompt and a chosen and a rejected response, by DPO or IPO
// (posttrain/dpo.h), fully or with LoRA adapters. The reference is the model as loaded: with
// LoRA its base with the adapters left out; otherwise a frozen copy, or with
// --precompute-ref its log-probabilities computed once before training. It reports the
// held-out preference metrics (TRL's names, prefixed eval_) and, for text rows, the held-out
// prompts answered exactly with the chosen response before and after, and writes the adapter
// and/or the model as finetune does.
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "apps/meshtrain/chat_setup.h"
#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/decoder_training.h"
#include "apps/meshtrain/held_out_answers.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/preference_rows.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/posttrain/dpo.h"
#include "meshtrain/posttrain/preference_data.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;

struct DpoCommandOptions {
  std::string model;
  std::string tokenizer;
  PreferenceFlags data;
  LoraFlags lora;
  StepFlags length{0, 1, 8, 1};
  double beta = 0.1;
  std::string loss = "sigmoid";
  double label_smoothing = 0.0;
  double rpo_alpha = 0.0;
  bool precompute_ref = false;
  bool dropout = false;
  OptimizerFlags optimizer{0, 0};  // learning rate 0: 5e-5 with LoRA, 1e-6 for all weights (TRL's default)
  int64_t check_rows = 32;
  int64_t sample_tokens = 32;
  RunFlags run;
};

std::string metric_line(const std::map<std::string, double>& m) {
  std::ostringstream line;
  line << std::setprecision(4);
  for (const char* k : {"eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_rewards/chosen",
                        "eval_rewards/rejected"})
    if (m.count(k)) line << (line.tellp() > 0 ? ", " : "") << (k + 5) << " " << m.at(k);
  return line.str();
}

void run(const DpoCommandOptions& o) {
  check_output_dir(o.run, "dpo");
  train::arm_stop_request();  // Ctrl-C: stop after the step, checkpoint, exit 130
  posttrain::DpoOptions dpo;
  dpo.beta = o.beta;
  dpo.loss = posttrain::parse_dpo_loss(o.loss);
  dpo.label_smoothing = o.label_smoothing;
  dpo.rpo_alpha = o.rpo_alpha;
  dpo.dropout = o.dropout;
  posttrain::check_dpo_options(dpo);
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  po.load_tokenizer = o.tokenizer.empty();
  auto model = load_decoder(o.model, po, "dpo");
  PreferenceFlags data = o.data;
  data.seq_len = length_within_positions(data.seq_len, model->causal_lm().max_positions, "--seq-len", o.model, deployer, "dpo");
  std::shared_ptr<tokenizers::Tokenizer> tok = o.tokenizer.empty() ? model->tokenizer : tokenizers::load_tokenizer(o.tokenizer);
  MT_CHECK(tok != nullptr, "[dpo] ", o.model, " has no tokenizer: pass --tokenizer PATH");
  const std::string tokenizer_source = o.tokenizer.empty() ? model->source : o.tokenizer;
  std::optional<int64_t> eos = end_of_text_id(*tok);
  if (!eos && !model->causal_lm().stop_tokens.empty()) eos = model->causal_lm().stop_tokens[0];

  // Everything that can be wrong with the data, the template or LoRA fails here, before a
  // file is written.
  serve::ServedModel chat;
  load_chat_template(chat, o.model, data.chat_template, "dpo");
  PreferenceCorpus corpus = make_preference_corpus(data, *tok, eos, chat);
  if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());
  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);

  posttrain::DpoReference reference;
  std::string reference_text = "the base model with the adapters left out";
  if (o.precompute_ref) {
    reference.kind = posttrain::DpoReference::Kind::precomputed;
    reference_text = "log-probabilities precomputed over the data";
  } else if (!o.lora.enabled()) {
    reference = posttrain::DpoReference::frozen_copy(model->params, &plan);
    reference_text = "a frozen copy of the model";
  }

  train::FitOptions f;
  const int64_t total = plan_fit(o.length, corpus.train->size(), deployer, f);
  const DecoderOptimizer opt = decoder_optimizer(o.optimizer, o.run, total, o.lora.enabled() ? 5e-5 : 1e-6, o.lora, model->params, "dpo");
  std::ostringstream intro;
  intro << "dpo: " << model->model_type << " from " << o.model << " ("
        << (o.lora.enabled() ? "LoRA rank " + std::to_string(o.lora.rank) + ", " : std::string("all weights, "))
        << opt.trainable << " of " << model->params.total_elements() << " parameters trained), " << posttrain::dpo_loss_name(dpo.loss)
        << " loss, beta " << dpo.beta << (dpo.label_smoothing > 0 ? ", label smoothing " + std::to_string(dpo.label_smoothing) : "")
        << (dpo.rpo_alpha > 0 ? ", RPO alpha " + std::to_string(dpo.rpo_alpha) : "")
        << ", reference: " << reference_text << "; " << data.data << ": " << corpus.rows - corpus.eval_rows << " train / "
        << corpus.eval_rows << " eval pairs (" << (corpus.conversational ? "conversations" : "text") << ", "
        << corpus.truncated << " truncated), " << total << " steps of "
        << o.length.per_device_batch_size * deployer.data_size() * o.length.grad_accum
        << (data.pad_multiple() > 0 ? " pairs of up to " : " pairs of ") << data.seq_len
        << " tokens on mesh " << deployer.mesh().str();
  deployer.log(intro.str());

  // --dry-run measures one step's memory on the first batch: at full length, the most any
  // batch cut after its last target can need.
  const int64_t pad_multiple = o.run.dry_run ? 0 : data.pad_multiple();
  train::Trainer trainer(deployer, posttrain::preference_collate(pad_multiple), posttrain::dpo_loss_fn(model, reference, dpo),
                         std::move(model->params), opt.transform, plan);
  if (pad_multiple > 0) trainer.set_padded_fields(posttrain::preference_padded_fields());
  std::shared_ptr<const data::Dataset> train_data = corpus.train, eval_data = corpus.eval;
  if (o.precompute_ref) {
    // The reference's scores under the parameters as loaded (a resumed run restores its own
    // only inside fit): with LoRA the adapters are left out.
    train_data = posttrain::with_reference_logps(train_data, *model, trainer.params(), deployer,
                                                 o.length.per_device_batch_size, pad_multiple);
    if (eval_data)
      eval_data = posttrain::with_reference_logps(eval_data, *model, trainer.params(), deployer,
                                                  o.length.per_device_batch_size, pad_multiple);
    deployer.log("reference log-probabilities precomputed for " + std::to_string(corpus.rows) + " pairs");
  }
  if (eval_data && !o.run.dry_run)
    deployer.log("eval before training: " + metric_line(trainer.eval_metrics(eval_data, o.length.per_device_batch_size)));
  if (!corpus.eval_prompts.empty() && !o.run.dry_run)
    exact_answers(*model, trainer.params(), *tok, corpus.eval_prompts, corpus.eval_chosen, o.check_rows, o.sample_tokens,
                  eos, "before", deployer);

  f.eval_data = eval_data;
  apply_training_flags(o.optimizer, o.run, opt, *model, tokenizer_source, f);
  f.checkpoint_extra["dpo"] = {{"beta", dpo.beta}, {"loss", posttrain::dpo_loss_name(dpo.loss)},
                               {"label_smoothing", dpo.label_smoothing}, {"rpo_alpha", dpo.rpo_alpha}};
  // Batches cut after their last targets have no fixed token count: the rate is in pairs.
  f.tokens_per_example = pad_multiple > 0 ? 0 : 2 * data.seq_len;
  train::FitResult r = trainer.fit(train_data, f);
  trainer.release_optimizer_state();  // generation below gets its memory
  if (!r.evals.empty()) deployer.log("eval after training: " + metric_line(r.evals.back()));
  if (!corpus.eval_prompts.empty())
    exact_answers(*model, trainer.params(), *tok, corpus.eval_prompts, corpus.eval_chosen, o.check_rows, o.sample_tokens,
                  eos, "after", deployer);

  export_trained_model(trainer, *model, o.lora, o.model, tokenizer_source, o.run, deployer);
}

}  // namespace

void add_dpo_command(CLI::App& app) {
  auto o = std::make_shared<DpoCommandOptions>();
  o->run.output_dir = "runs/dpo";
  CLI::App* cmd = app.add_subcommand(
      "dpo", "preference-tune a decoder on prompt/chosen/rejected rows (DPO or IPO; all weights or LoRA adapters)");
  cmd->add_option("--model", o->model, "model directory (Hugging Face or meshtrain run/checkpoint) or llama2.c .bin")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file or directory (default: the model directory's)");
  add_preference_flags(cmd, o->data);
  cmd->add_option("--beta", o->beta, "how far the policy may move from the reference (DPO's beta, IPO's tau)")
      ->capture_default_str();
  cmd->add_option("--loss", o->loss, "sigmoid (DPO) or ipo")->capture_default_str()->check(CLI::IsMember({"sigmoid", "ipo"}));
  cmd->add_option("--label-smoothing", o->label_smoothing, "conservative DPO: the assumed share of flipped labels, in [0, 0.5)")
      ->capture_default_str();
  cmd->add_option("--rpo-alpha", o->rpo_alpha,
                  "RPO: add this times the chosen responses' NLL, so they keep their likelihood (0: off)")
      ->capture_default_str();
  cmd->add_flag("--precompute-ref", o->precompute_ref,
                "score the data with the reference once before training and hold no reference model");
  cmd->add_flag("--dropout", o->dropout, "keep the model's dropout on while training (off by default, as TRL)");
  add_lora_flags(cmd, o->lora);
  add_step_flags(cmd, o->length);
  add_optimizer_flags(cmd, o->optimizer, "peak learning rate (default: 5e-5 with LoRA, 1e-6 otherwise)");
  cmd->add_option("--check-rows", o->check_rows, "held-out prompts answered greedily before and after (text rows)")
      ->capture_default_str();
  cmd->add_option("--sample-tokens", o->sample_tokens, "tokens generated per held-out prompt")->capture_default_str();
  add_run_flags(cmd, o->run, true);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
