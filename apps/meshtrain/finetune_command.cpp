// `meshtrain finetune`: a pretrained decoder (Hugging Face directory, meshtrain run or
// llama2.c file) fine-tuned on a user's rows — causal LM on a text field, or supervised
// fine-tuning on prompt/response pairs with the loss on responses only — fully or with LoRA
// adapters on the frozen model. It reports the held-out loss and the held-out responses the
// model reproduces exactly (greedy) before and after, and writes the adapter as a PEFT
// directory and/or the full model as a Hugging Face directory.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/decoder_training.h"
#include "apps/meshtrain/held_out_answers.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "apps/meshtrain/sft_data.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct FinetuneOptions {
  std::string model;
  std::string tokenizer;
  SftFlags data;
  LoraFlags lora;
  StepFlags length{0, 3, 8, 1};
  OptimizerFlags optimizer{0, 10};  // learning rate 0: 1e-3 with LoRA, 5e-5 for all weights
  int64_t check_rows = 32;  // held-out rows whose greedy answers are compared
  int64_t sample_tokens = 32;
  RunFlags run;
};

// The held-out rows' template prompts, as generation sees them.
std::vector<std::string> held_out_prompts(const SftCorpus& c, const FinetuneOptions& o) {
  std::vector<std::string> prompts;
  for (const std::string& p : c.eval_prompts) prompts.push_back(prompt_text(o.data.template_text, p));
  return prompts;
}

void run(const FinetuneOptions& o) {
  check_output_dir(o.run, "finetune");
  train::arm_stop_request();  // Ctrl-C: stop after the step, checkpoint, exit 130
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  po.load_tokenizer = o.tokenizer.empty();
  auto model = load_decoder(o.model, po, "finetune");
  SftFlags data = o.data;
  data.seq_len = length_within_positions(data.seq_len, model->causal_lm().max_positions, "--seq-len", o.model, deployer,
                                         "finetune");
  std::shared_ptr<tokenizers::Tokenizer> tok = o.tokenizer.empty() ? model->tokenizer : tokenizers::load_tokenizer(o.tokenizer);
  MT_CHECK(tok != nullptr, "[finetune] ", o.model, " has no tokenizer: pass --tokenizer PATH");
  const std::string tokenizer_source = o.tokenizer.empty() ? model->source : o.tokenizer;
  std::optional<int64_t> eos = end_of_text_id(*tok);
  if (!eos && !model->causal_lm().stop_tokens.empty()) eos = model->causal_lm().stop_tokens[0];

  // Everything that can be wrong with the data or the LoRA settings fails here, before a
  // file is written.
  SftCorpus corpus = make_sft_corpus(data, *tok, eos);
  if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());
  const int64_t global_batch = o.length.per_device_batch_size * deployer.data_size();
  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);

  train::FitOptions f;
  const int64_t total = plan_fit(o.length, corpus.train->size(), deployer, f);
  const DecoderOptimizer opt =
      decoder_optimizer(o.optimizer, o.run, total, o.lora.enabled() ? 1e-3 : 5e-5, o.lora, model->params, "finetune");
  std::ostringstream intro;
  intro << "finetune: " << model->model_type << " from " << o.model << " ("
        << (o.lora.enabled() ? "LoRA rank " + std::to_string(o.lora.rank) + ", " : std::string("all weights, "))
        << opt.trainable << " of " << model->params.total_elements() << " parameters trained) on " << data.data << ": "
        << corpus.rows - corpus.eval_rows << " train / " << corpus.eval_rows << " eval rows ("
        << (corpus.supervised ? "prompt/response, loss on responses" : "text") << ", " << corpus.target_tokens
        << " target tokens, " << corpus.truncated << " truncated), " << total << " steps of " << global_batch * o.length.grad_accum
        << (data.pad_multiple() > 0 ? " sequences of up to " : " sequences of ") << data.seq_len << " on mesh " << deployer.mesh().str();
  deployer.log(intro.str());

  // Moved: the trainer holds the only handles, so each step updates the parameters in place
  // and a sharded plan keeps no unsharded copy beside its shards.
  // --dry-run measures one step's memory on the first batch: at full length, the most any
  // batch cut after its last target can need.
  const int64_t pad_multiple = o.run.dry_run ? 0 : data.pad_multiple();
  train::Trainer trainer(deployer, lm_collate(pad_multiple), lm_loss(model), std::move(model->params),
                         opt.transform, plan);
  if (pad_multiple > 0) trainer.set_padded_fields(lm_padded_fields());
  std::optional<double> eval_before;
  if (corpus.eval) {
    eval_before = trainer.eval_loss(corpus.eval, o.length.per_device_batch_size);
    deployer.log("eval loss before fine-tuning " + std::to_string(*eval_before));
  }
  if (corpus.supervised && !o.run.dry_run)
    exact_answers(*model, trainer.params(), *tok, held_out_prompts(corpus, o), corpus.eval_responses, o.check_rows,
                  o.sample_tokens, eos, "before", deployer);

  f.eval_data = corpus.eval;
  apply_training_flags(o.optimizer, o.run, opt, *model, tokenizer_source, f);
  // Batches cut after their last target have no fixed token count: the rate is in sequences.
  f.tokens_per_example = pad_multiple > 0 ? 0 : data.seq_len;
  train::FitResult r = trainer.fit(corpus.train, f);
  trainer.release_optimizer_state();  // the export below gathers the weights into its memory

  if (eval_before && !r.evals.empty() && r.evals.back().count("eval_loss")) {
    const double after = r.evals.back().at("eval_loss");
    std::ostringstream line;
    line << "eval loss " << std::setprecision(6) << *eval_before << " -> " << after << " ("
         << std::setprecision(3) << 100.0 * (1.0 - after / *eval_before) << " % lower)";
    deployer.log(line.str());
  }
  if (corpus.supervised)
    exact_answers(*model, trainer.params(), *tok, held_out_prompts(corpus, o), corpus.eval_responses, o.check_rows,
                  o.sample_tokens, eos, "after", deployer);

  export_trained_model(trainer, *model, o.lora, o.model, tokenizer_source, o.run, deployer);
}

}  // namespace

void add_finetune_command(CLI::App& app) {
  auto o = std::make_shared<FinetuneOptions>();
  o->run.output_dir = "runs/finetune";
  CLI::App* cmd = app.add_subcommand(
      "finetune", "fine-tune a pretrained decoder on text or prompt/response rows (all weights or LoRA adapters)");
  cmd->add_option("--model", o->model, "model directory (Hugging Face or meshtrain run/checkpoint) or llama2.c .bin")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file or directory (default: the model directory's)");
  add_sft_data_flags(cmd, o->data);
  add_lora_flags(cmd, o->lora);
  add_step_flags(cmd, o->length);
  add_optimizer_flags(cmd, o->optimizer, "peak learning rate (default: 1e-3 with LoRA, 5e-5 otherwise)");
  cmd->add_option("--check-rows", o->check_rows, "held-out prompts answered greedily before and after (SFT)")
      ->capture_default_str();
  cmd->add_option("--sample-tokens", o->sample_tokens, "tokens generated per held-out prompt")->capture_default_str();
  add_run_flags(cmd, o->run, true);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
