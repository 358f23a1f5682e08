// `meshtrain grpo`: reinforcement learning with verifiable rewards (GRPO, posttrain/grpo.h)
// of a decoder on prompts: each step samples G completions per prompt from the current policy
// with the serving engine, scores them (built-in rewards on the row's fields, or any program
// through --reward-command), and takes the clipped, KL-regularised policy-gradient step on
// the group-normalised advantages; fully or with LoRA adapters (then the reference is the
// base with the adapters off). Reports the held-out prompts' greedy reward before and after
// and writes the adapter and/or the model as finetune does.
#include <filesystem>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/meshtrain/chat_setup.h"
#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/decoder_training.h"
#include "apps/meshtrain/jsonl_objects.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "apps/meshtrain/sft_data.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/posttrain/dpo.h"
#include "meshtrain/posttrain/grpo.h"
#include "meshtrain/posttrain/grpo_rollout.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct GrpoCommandOptions {
  std::string model, tokenizer, data;
  std::string prompt_field = "prompt";
  std::string template_text = "{prompt}{response}";
  std::string chat_template;
  std::string reward, reward_command;
  posttrain::GrpoOptions grpo;
  double eval_fraction = 0.1;
  LoraFlags lora;
  StepFlags length{0, 1, 4, 1};
  OptimizerFlags optimizer{0, 0};  // learning rate 0: 1e-5 with LoRA, 1e-6 for all weights (TRL's default)
  RunFlags run;
};

struct PromptSet {
  std::shared_ptr<const data::Dataset> train, eval;  // prompt examples (grpo_rollout.h)
  bool conversational = false;
};

// The rows of --data as prompts: text through the template, or message lists through the chat
// template; every row must hold the fields the rewards read.
PromptSet read_prompts(const GrpoCommandOptions& o, const tokenizers::Tokenizer& tok, const serve::ServedModel& chat) {
  const std::vector<std::string> needed = posttrain::reward_fields(o.reward);
  std::vector<data::Example> rows;
  PromptSet s;
  for_each_json_object(o.data, "grpo", [&](const json& row, const std::string& at) {
    const json& p = required_field(row, o.prompt_field, at);
    for (const std::string& f : needed)
      MT_CHECK(row.contains(f), at, "no '", f, "' field for the reward (fields: ", keys_of(row), ")");
    data::Example fields;
    for (const auto& [k, v] : row.items()) {
      if (v.is_string()) fields.set(k, v.get<std::string>());
      else if (v.is_number_integer()) fields.set(k, v.get<int64_t>());
      else if (v.is_number()) fields.set(k, v.get<double>());
      else fields.set(k, v.dump());
    }
    std::string text;
    std::vector<int64_t> ids;
    if (p.is_array()) {
      s.conversational = true;
      try {
        text = serve::render_chat(p, chat, true);
      } catch (const Error& e) {
        throw Error(at + e.what());
      }
      tokenizers::Encoding e = tok.encode(text, !chat.chat_template);
      ids.assign(e.ids.begin(), e.ids.end());
    } else {
      MT_CHECK(p.is_string(), at, "field '", o.prompt_field, "' is neither text nor a list of messages");
      text = prompt_text(o.template_text, p.get<std::string>());
      tokenizers::Encoding e = tok.encode(text, true);
      ids.assign(e.ids.begin(), e.ids.end());
    }
    rows.push_back(posttrain::prompt_example(text, ids, fields));
  });
  MT_CHECK(!rows.empty(), "[grpo] ", o.data, " has no rows");
  const int64_t n = int64_t(rows.size());
  const int64_t n_eval = o.eval_fraction > 0 ? std::max<int64_t>(1, int64_t(double(n) * o.eval_fraction)) : 0;
  MT_CHECK(n_eval < n, "[grpo] ", o.data, ": ", n, " prompts leave none for training after holding out ", n_eval);
  s.train = data::make_dataset(std::vector<data::Example>(rows.begin(), rows.end() - n_eval));
  if (n_eval > 0) s.eval = data::make_dataset(std::vector<data::Example>(rows.end() - n_eval, rows.end()));
  return s;
}

std::string reward_line(const std::map<std::string, double>& m) {
  std::ostringstream line;
  line << std::setprecision(4) << "reward " << m.at("eval_reward");
  for (const auto& [k, v] : m)
    if (k.rfind("eval_rewards/", 0) == 0) line << ", " << k.substr(5) << " " << v;
  line << ", completion_length " << m.at("eval_completion_length");
  return line.str();
}

void run(const GrpoCommandOptions& o) {
  check_output_dir(o.run, "grpo");
  train::arm_stop_request();
  posttrain::check_grpo_options(o.grpo);
  MT_CHECK(!o.reward.empty() || !o.reward_command.empty(), "[grpo] name a reward: --reward KIND:ARG[,...] or --reward-command CMD");
  std::vector<posttrain::RewardFunction> rewards;
  if (!o.reward.empty()) rewards = posttrain::parse_rewards(o.reward);
  if (!o.reward_command.empty()) rewards.push_back(posttrain::command_reward(o.reward_command));
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  po.load_tokenizer = o.tokenizer.empty();
  auto model = load_decoder(o.model, po, "grpo");
  std::shared_ptr<tokenizers::Tokenizer> tok = o.tokenizer.empty() ? model->tokenizer : tokenizers::load_tokenizer(o.tokenizer);
  MT_CHECK(tok != nullptr, "[grpo] ", o.model, " has no tokenizer: pass --tokenizer PATH");
  const std::string tokenizer_source = o.tokenizer.empty() ? model->source : o.tokenizer;
  std::vector<int64_t> stops = model->causal_lm().stop_tokens;
  if (auto eot = end_of_text_id(*tok); eot && std::find(stops.begin(), stops.end(), *eot) == stops.end())
    stops.insert(stops.begin(), *eot);

  serve::ServedModel chat;
  load_chat_template(chat, o.model, o.chat_template, "grpo");
  const PromptSet prompts = read_prompts(o, *tok, chat);
  if (o.lora.enabled()) models::add_lora(*model, o.lora.options(), deployer.init_key());
  apply_remat(o.run, *model);
  train::ShardingPlan plan = make_plan(deployer, model->params, model->param_roles(), o.run);
  posttrain::GrpoReference reference;
  std::string reference_text = "none (beta 0)";
  if (o.grpo.beta > 0 && o.lora.enabled()) {
    reference.kind = posttrain::GrpoReference::Kind::adapters_off;
    reference_text = "the base model with the adapters left out";
  } else if (o.grpo.beta > 0) {
    reference.kind = posttrain::GrpoReference::Kind::frozen_copy;
    reference.frozen = posttrain::DpoReference::frozen_copy(model->params, &plan).frozen;
    reference_text = "a frozen copy of the model";
  }

  // Each batch of prompts is visited num_iterations times in a row (grpo_prompt_order).
  const int64_t global_batch = o.length.per_device_batch_size * deployer.data_size() * o.length.grad_accum;
  auto indexed = posttrain::with_prompt_indices(prompts.train);
  auto ordered = posttrain::grpo_prompt_order(indexed, global_batch, o.grpo.num_iterations, o.run.seed);
  train::FitOptions f;
  StepFlags length = o.length;
  if (length.steps > 0 && o.grpo.num_iterations > 1) length.epochs = 1;
  const int64_t total = plan_fit(length, ordered->size(), deployer, f);
  f.shuffle = false;
  const DecoderOptimizer opt = decoder_optimizer(o.optimizer, o.run, total, o.lora.enabled() ? 1e-5 : 1e-6, o.lora, model->params, "grpo");
  std::string reward_names;
  for (const auto& r : rewards) reward_names += (reward_names.empty() ? "" : " + ") + r.name;
  std::ostringstream intro;
  intro << "grpo: " << model->model_type << " from " << o.model << " ("
        << (o.lora.enabled() ? "LoRA rank " + std::to_string(o.lora.rank) + ", " : std::string("all weights, "))
        << model->params.total_elements() << " parameters), reward " << reward_names << ", " << o.grpo.num_generations
        << " completions of up to " << o.grpo.max_completion_length << " tokens per prompt at temperature "
        << o.grpo.temperature << ", beta " << o.grpo.beta << ", epsilon " << o.grpo.epsilon << ", "
        << o.grpo.num_iterations << " step(s) per rollout, reference: " << reference_text << "; " << o.data << ": "
        << prompts.train->size() << " train / " << (prompts.eval ? prompts.eval->size() : 0) << " eval prompts ("
        << (prompts.conversational ? "conversations" : "text") << "), " << total << " steps of " << global_batch
        << " prompts on mesh " << deployer.mesh().str();
  deployer.log(intro.str());

  auto rollout = std::make_shared<posttrain::GrpoRollout>(model, indexed, rewards, o.grpo, deployer, tok, stops, reference);
  train::Trainer trainer(deployer, posttrain::prompt_index_collate(), posttrain::grpo_loss_fn(model, o.grpo),
                         std::move(model->params), opt.transform, plan);
  trainer.set_rollout([rollout](const Params& p, const std::vector<train::Batch>& micro, int64_t step, const RngKey& key) {
    return (*rollout)(p, micro, step, key);
  });
  if (prompts.eval) {
    if (!o.run.dry_run) deployer.log("held-out greedy " + reward_line(rollout->evaluate(trainer.params(), *prompts.eval)));
    f.eval_fn = [rollout, eval = prompts.eval](const Params& p) { return rollout->evaluate(p, *eval); };
  }
  apply_training_flags(o.optimizer, o.run, opt, *model, tokenizer_source, f);
  f.checkpoint_extra["grpo"] = {{"num_generations", o.grpo.num_generations}, {"beta", o.grpo.beta},
                                {"epsilon", o.grpo.epsilon}, {"num_iterations", o.grpo.num_iterations},
                                {"temperature", o.grpo.temperature}, {"reward", o.reward}, {"reward_command", o.reward_command}};
  train::FitResult r = trainer.fit(ordered, f);
  trainer.release_optimizer_state();
  if (!r.evals.empty() && r.evals.back().count("eval_reward")) deployer.log("held-out greedy after: " + reward_line(r.evals.back()));

  export_trained_model(trainer, *model, o.lora, o.model, tokenizer_source, o.run, deployer);
}

}  // namespace

void add_grpo_command(CLI::App& app) {
  auto o = std::make_shared<GrpoCommandOptions>();
  o->run.output_dir = "runs/grpo";
  CLI::App* cmd = app.add_subcommand(
      "grpo", "reinforcement learning of a decoder on prompts with verifiable rewards (GRPO; all weights or LoRA adapters)");
  cmd->add_option("--model", o->model, "model directory (Hugging Face or meshtrain run/checkpoint) or llama2.c .bin")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file or directory (default: the model directory's)");
  cmd->add_option("--data", o->data, "prompts (.jsonl): a prompt field (text or chat messages) and the fields rewards read")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt-field", o->prompt_field, "the prompt's field")->capture_default_str();
  cmd->add_option("--template", o->template_text, "how a text prompt reads (the part before {response} is the prompt)")
      ->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template, "a Jinja chat template file for message prompts (default: the model's)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--reward", o->reward,
                  "built-in rewards, summed: exact_match:FIELD (the first line equals FIELD), numeric:FIELD (the last "
                  "number equals FIELD's), format:REGEX (the whole completion matches)");
  cmd->add_option("--reward-command", o->reward_command,
                  "a program scoring completions: JSON lines (prompt, completion, the row's fields) on stdin, one number "
                  "per line on stdout");
  cmd->add_option("--num-generations", o->grpo.num_generations, "completions per prompt (G)")->capture_default_str();
  cmd->add_option("--max-completion-length", o->grpo.max_completion_length, "new tokens per completion at most")
      ->capture_default_str();
  cmd->add_option("--temperature", o->grpo.temperature, "sampling temperature")->capture_default_str();
  cmd->add_option("--top-p", o->grpo.top_p, "nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", o->grpo.top_k, "sample among the k likeliest tokens (0: all)")->capture_default_str();
  cmd->add_option("--beta", o->grpo.beta, "weight of the KL to the reference (0: no reference)")->capture_default_str();
  cmd->add_option("--epsilon", o->grpo.epsilon, "clip range of the probability ratio")->capture_default_str();
  cmd->add_option("--num-iterations", o->grpo.num_iterations, "optimizer steps per batch of rollouts")->capture_default_str();
  cmd->add_flag("--dropout", o->grpo.dropout, "keep the model's dropout on while training (off by default)");
  cmd->add_option("--eval-fraction", o->eval_fraction, "share of the prompts (the last ones) held out for the greedy reward")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  add_lora_flags(cmd, o->lora);
  add_step_flags(cmd, o->length);
  add_optimizer_flags(cmd, o->optimizer, "peak learning rate (default: 1e-5 with LoRA, 1e-6 otherwise)");
  add_run_flags(cmd, o->run, true);
  cmd->callback([o] { run(*o); });
}

}  // namespace mt::cli
