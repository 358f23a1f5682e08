#include "apps/meshtrain/lora_flags.h"

#include <filesystem>
#include <iostream>

#include "apps/meshtrain/flag_checks.h"
#include "meshtrain/optim/partition.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::cli {

models::LoraOptions LoraFlags::options() const {
  models::LoraOptions o;
  o.rank = rank;
  o.alpha = alpha;
  o.dropout = dropout;
  o.targets = targets;
  o.use_rslora = rslora;
  return o;
}

void add_lora_flags(CLI::App* cmd, LoraFlags& f) {
  cmd->add_option("--lora-rank", f.rank, "train LoRA adapters of this rank on a frozen model (0: all weights)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_option("--lora-alpha", f.alpha, "LoRA scale numerator: updates are scaled by alpha / rank")
      ->capture_default_str();
  cmd->add_option("--lora-dropout", f.dropout, "dropout on the adapters' input while training")->capture_default_str();
  cmd->add_option("--lora-targets", f.targets,
                  "regex searched in module paths (e.g. 'q_proj|v_proj'; default: attention and MLP projections)");
  cmd->add_flag("--use-rslora", f.rslora, "rank-stabilized LoRA: scale by alpha / sqrt(rank)");
  cmd->add_flag("--merge-lora", f.merge, "also export the model with the adapters merged into its weights");
}

void add_adapter_flag(CLI::App* cmd, std::string& adapter) {
  cmd->add_option("--adapter", adapter, "a PEFT LoRA adapter directory (adapter_config.json) applied to --model")
      ->check(CLI::ExistingDirectory);
}

void apply_adapter(models::PretrainedModel& model, const std::string& adapter, bool log) {
  if (adapter.empty()) return;
  const std::vector<std::string> replaced = models::load_adapter(model, adapter);
  if (!log) return;
  std::cerr << "meshtrain: LoRA adapter " << adapter << " (rank " << model.config.lora().rank << ", alpha "
            << model.config.lora().alpha << ") on " << model.source << "\n";
  if (!replaced.empty())
    std::cerr << "meshtrain: the adapter's trained modules replace the model's [" << detail::join(replaced) << "]\n";
}

optim::Transform lora_optimizer(optim::Transform inner, const std::string& also_train) {
  std::string trainable = models::lora_parameter_pattern();
  if (!also_train.empty()) trainable = "(?:" + trainable + ")|(?:" + also_train + ")";
  return optim::partition({{trainable, std::move(inner)}, {".*", optim::freeze()}});
}

std::function<optim::Transform(optim::Transform)> lora_wrap(const LoraFlags& lora, const std::string& also_train) {
  if (!lora.enabled()) return nullptr;
  return [also_train](optim::Transform inner) { return lora_optimizer(std::move(inner), also_train); };
}

bool save_trained_weights(train::Trainer& trainer, models::PretrainedModel& model, const LoraFlags& lora,
                          const std::string& base_model, const std::string& tokenizer_source, const RunFlags& run,
                          const train::Deployer& deployer) {
  trainer.release_optimizer_state();
  const std::filesystem::path dir(run.output_dir);
  if (lora.enabled()) model.params = gathered_params(trainer, deployer);  // the adapter and the merge
  if (!lora.enabled() || lora.merge)
    export_model(trainer, deployer, model, (dir / "model").string(), dtype_from_name(run.save_dtype));  // collective
  if (!deployer.is_main()) return false;
  if (lora.enabled()) {
    models::save_adapter(model, (dir / "adapter").string(), base_model);
    std::cout << "adapter in " << (dir / "adapter").string() << " (PEFT layout; apply with --adapter)" << std::endl;
  }
  if (!lora.enabled() || lora.merge) {
    if (!tokenizer_source.empty()) tokenizers::copy_tokenizer_files(tokenizer_source, (dir / "model").string());
    std::cout << "model in " << (dir / "model").string() << (lora.enabled() ? " (adapters merged)" : "") << std::endl;
  }
  return true;
}

}  // namespace mt::cli
