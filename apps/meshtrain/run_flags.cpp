#include "apps/meshtrain/run_flags.h"

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "meshtrain/ops/attention.h"
#include "meshtrain/backend/cpu/cpu_features.h"
#include "meshtrain/core/error.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/distributed/grad_reducer.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/io/json.h"
#include "meshtrain/train/checkpoint.h"
#include "meshtrain/train/profiler.h"

namespace mt::cli {

namespace fs = std::filesystem;

void add_allow_new_heads_flag(CLI::App* cmd, bool& allow) {
  cmd->add_flag("--allow-new-heads", allow,
                "initialize the parameters the model checkpoint lacks (listed in the load report) instead of failing");
}

void add_precision_flag(CLI::App* cmd, std::string& precision) {
  // Checked when parsed, by the same function precision_scope uses (which also explains f16).
  const auto known_policy = [](const std::string& name) {
    try {
      precision_policy_from_name(name, "--precision");
      return std::string();
    } catch (const std::exception& e) {
      const std::string why = e.what();  // CLI11 names the flag already: "[--precision] " dropped
      const size_t tag = why.find("] ");
      return tag == std::string::npos ? why : why.substr(tag + 2);
    }
  };
  cmd->add_option("--precision", precision,
                  "f32; tf32 (GPU: TF32 tensor cores; CPU: f32); bf16 (mixed precision: f32 master weights and "
                  "optimizer state, parameters cast to bf16 once per step, bf16 activations, norms/softmax/losses "
                  "computed in f32); f16 (the same in IEEE half, with the loss scaled: see --loss-scale); bf16-matmul "
                  "(everything f32, only matmul operands rounded to bf16)")
      ->capture_default_str()
      ->check(CLI::Validator(known_policy, "PRECISION"));
}

void add_device_flag(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "where to run: auto (the GPU when one is visible), cpu, cuda or cuda:N")
      ->capture_default_str()
      ->check([](const std::string& text) {
        try {
          Device::parse(text);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
}

void add_run_flags(CLI::App* cmd, RunFlags& f, bool training) {
  add_device_flag(cmd, f.device);
  cmd->add_option("--attention", f.attention,
                  "attention (causal, or with at most a key-padding mask): fused (flash-style: no T x T probabilities in "
                  "memory), composed (GEMMs + "
                  "fused softmax, probabilities kept for the backward) or auto (CPU: fused for f32 math, composed for "
                  "bf16 below 512 keys; GPU: fused where the tensor-core kernels apply, f32 arrays with head dim <= 64 on sm_80+, "
                  "else composed)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "composed", "fused"}));
  cmd->add_option("--mesh", f.mesh, "device mesh, e.g. data=2,model=2 (its size must equal the number of processes)");
  cmd->add_option("--model-shards", f.model_shards, "shards of each weight (tensor parallel); data = processes / shards")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--seed", f.seed, "random seed (initialization, shuffling, dropout, sampling)")->capture_default_str();
  if (training)  // eval writes no run folder (its --output names a results file)
    cmd->add_option("--output-dir,--output_dir", f.output_dir, "where checkpoints, metrics.jsonl and TensorBoard events go")
        ->capture_default_str();
  cmd->add_flag("--print-plan", f.print_plan, "print the sharding plan (path, shape, spec, bytes per rank)");
  cmd->add_flag("--dry-run", f.dry_run,
                "print the sharding plan and the training state per rank (weights, gradients, AdamW moments), run "
                "one step on the first batch and print its measured memory per rank, then exit (nothing saved)");
  add_precision_flag(cmd, f.precision);
  if (!training) return;
  cmd->add_flag("--fsdp", f.fsdp, "also shard large weights and their optimizer state over the data axis");
  cmd->add_option("--grad-reduce-dtype", f.grad_reduce_dtype,
                  "the dtype data-parallel gradients travel in between processes: f32, or bf16 (half the bytes; each "
                  "rank's gradient rounded to bf16 once and summed in f32: all-reduced sums rounded once more, "
                  "--fsdp's reduce-scattered shards kept in f32); tensor-parallel sums stay f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--remat", f.remat,
                  "activation checkpointing: none (store every activation), block (keep each transformer block's "
                  "input, recompute the block in backward), full (block, and the output head's logits in recomputed "
                  "chunks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "block", "full"}));
  cmd->add_option("--save-dtype", f.save_dtype,
                  "dtype of the exported model folder (checkpoints always keep the f32 master weights): f32, bf16 or "
                  "f16 (half the size; config.json's torch_dtype says which)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--read-loss-every", f.read_loss_every,
                  "read the steps' losses (and their deferred index checks) from the device every N steps, in one "
                  "copy, so the host queues steps without waiting for each; logged when read (0: 16 on a GPU, 1 on "
                  "the CPU; at most 1024)")
      ->capture_default_str()
      ->check(integer_range(0, 1024));
  cmd->add_option("--logging-steps", f.logging_steps,
                  "where the output is not a terminal (a log file, mpirun): a progress line every N steps (0: every "
                  "10 % of the run)")
      ->capture_default_str()
      ->check(non_negative());
  cmd->add_flag("--reschedule", f.reschedule,
                "with --resume and another --steps: fit the learning-rate schedule to the new step count (by default "
                "the run keeps the schedule it was planned with)");
  cmd->add_flag("--resume", f.resume, "continue from the newest checkpoint in --output-dir");
  cmd->add_option("--checkpoint-writes", f.checkpoint_writes,
                  "write checkpoint files from a copy while training goes on (background), or before it does "
                  "(foreground); auto: in the background for a state on a GPU whose host copy fits in half the available "
                  "memory (on the CPU the copy would add the state to the peak memory)")
      ->check(CLI::IsMember({"auto", "background", "foreground"}))
      ->capture_default_str();
  cmd->add_option("--cuda-graphs", f.cuda_graphs,
                  "on a GPU, capture each batch shape's training step as one CUDA graph after warm-up and replay it "
                  "(the host no longer launches its kernels one by one); auto: when a step cannot be captured, say "
                  "why and go on eagerly; on: stop with the reason instead; off: never")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--loss-scale", f.loss_scale,
                  "with --precision f16: dynamic (start at 65536, halve and skip the step when the gradients overflow, "
                  "double after --loss-scale-window finite steps; PyTorch GradScaler's rule) or a fixed scale (overflowing "
                  "steps are still skipped)")
      ->capture_default_str()
      ->check([](const std::string& text) { return loss_scale_error(text); });
  cmd->add_option("--loss-scale-window", f.loss_scale_window,
                  "with --precision f16 and a dynamic scale: finite steps in a row before the scale doubles")
      ->capture_default_str()
      ->check(positive());
  cmd->add_flag("--overwrite,--overwrite-output-dir", f.overwrite, "discard checkpoints of an earlier run in --output-dir");
  cmd->add_option("--peak-gflops", f.peak_gflops,
                  "the GEMM peak MFU is reported against (default: measured once per machine and cached)")
      ->check(non_negative());
  cmd->add_option("--profile", f.profile,
                  "profile optimizer steps START:END (from 1, inclusive) into <output-dir>/profile: trace.json "
                  "(Perfetto), ops.txt, ops.json")
      ->check([](const std::string& text) {
        try {
          train::ProfileRange::parse(text);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
}

train::Deployer make_deployer(const RunFlags& f) {
  train::DeployerOptions o;
  o.seed = f.seed;
  o.mesh = f.mesh;
  o.n_model_shards = f.model_shards;
  o.workdir = f.output_dir;
  o.device = f.device;
  set_attention_kernel(attention_kernel_from_name(f.attention));
  dist::set_grad_reduce_dtype(f.grad_reduce_dtype == "bf16" ? DType::bf16 : DType::f32);
  // The axis names first, from the text: an unknown axis is the mistake to name even when the
  // process count is wrong too (it was said only once the run had been launched under mpirun).
  for (size_t start = 0; !f.mesh.empty();) {
    const size_t comma = f.mesh.find(',', start);
    std::string axis = f.mesh.substr(start, std::min(f.mesh.find('=', start), comma) - start);
    axis.erase(0, axis.find_first_not_of(' '));
    axis.erase(axis.find_last_not_of(' ') + 1);
    MT_CHECK(axis == "data" || axis == "model", "[mesh] '", f.mesh,
             "': the commands shard over axes 'data' and 'model', not '", axis, "'");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return train::Deployer(o);
}

int64_t length_within_positions(int64_t asked, int64_t positions, const std::string& flag, const std::string& source,
                                const train::Deployer& deployer, const std::string& command) {
  if (positions <= 0 || asked <= positions) return asked;
  deployer.log(detail::concat(command, ": ", flag, " ", asked, " exceeds the ", positions, " positions of ",
                              source.empty() ? std::string("the model") : source, "; using ", positions));
  return positions;
}

void print_cpu_line() {
  // On stderr, so the ids, text and JSON that generate, eval and tokenize print stay clean on stdout.
  // The summary is formed first: detecting the CPU may throw (a bad MESHTRAIN_* variable),
  // and a half-printed line would prefix the error message.
  const std::string summary = cpu::cpu_summary();
  if (dist::world().rank() == 0) std::cerr << "meshtrain: " << summary << "\n";
}

std::unique_ptr<PrecisionScope> precision_scope(const std::string& precision) {
  PrecisionPolicy p = precision_policy_from_name(precision, "--precision");
  print_cpu_line();
  const bool bf16 = p.compute_dtype == DType::bf16 || p.matmul == MatmulPrecision::bf16;
  if (bf16 && current_device().is_cpu() && !cpu::cpu_features().bf16_gemm_onednn && dist::world().rank() == 0)
    std::cerr << "meshtrain: --precision " << precision << " is emulated on this CPU (" << cpu::cpu_features().isa
              << ": no native bf16 GEMM below AVX-512): bf16 operands are widened and multiplied by the f32 GEMM, so "
                 "results are bf16's but there is no speed-up over f32\n";
  if (p.compute_dtype == DType::f16 && current_device().is_cpu() && !cpu::cpu_features().f16_gemm_native &&
      dist::world().rank() == 0)
    std::cerr << "meshtrain: --precision f16 is emulated on this CPU (" << cpu::cpu_features().isa
              << ": this oneDNN has no f16 GEMM for it): f16 operands are widened and multiplied by the f32 GEMM, "
                 "so results are f16's but the step is slower than f32's (use bf16 on a CPU; f16 is for GPUs without "
                 "bf16 and for checking an f16 run before it goes to one)\n";
  return std::make_unique<PrecisionScope>(std::move(p));
}

train::ShardingPlan make_plan(const train::Deployer& deployer, const Params& params, const models::ParamRoles& roles,
                              const RunFlags& f) {
  train::ShardingOptions so;
  so.fsdp = f.fsdp;
  train::ShardingPlan plan = deployer.sharding_rules(params, roles, so);
  if ((f.print_plan || f.dry_run) && deployer.is_main()) {
    std::cout << "sharding plan on mesh " << deployer.mesh().str() << ":\n" << plan.table();
    // Where each rank runs, with its mesh coordinates.
    const dist::Mesh& mesh = deployer.mesh();
    std::cout << "ranks:";
    for (int r = 0; r < int(deployer.hosts().size()); ++r) {
      std::cout << (r ? "," : "") << " " << r << " (";
      const std::vector<int> coords = mesh.coords_of(r);
      for (size_t i = 0; i < coords.size(); ++i) std::cout << (i ? " " : "") << mesh.axis_names()[i] << "=" << coords[i];
      std::cout << ") on " << deployer.hosts()[size_t(r)];
    }
    std::cout << "\n" << std::flush;
  }
  if (f.dry_run && deployer.is_main()) {
    // Per rank, before anything is allocated for training: the weights as the plan lays them
    // out, f32 gradients of the same layout and AdamW's two f32 moments; bf16 and f16 add the
    // per-step copy in that dtype. The Trainer then runs one step and measures it, activations included.
    double weights = 0, elements = 0;
    for (const train::PlanEntry& e : plan.entries()) {
      weights += double(e.bytes_per_rank);
      elements += double(e.bytes_per_rank) / double(dtype_size(params[e.path].dtype()));
    }
    const double gb = 1e9;
    const double grads = 4 * elements, moments = 8 * elements;
    const PrecisionPolicy policy = precision_policy_from_name(f.precision);
    const double copy = policy.casts_parameters() ? double(dtype_size(policy.compute_dtype)) * elements : 0;
    std::cout << std::fixed << std::setprecision(2) << "training state per rank: weights " << weights / gb
              << " GB + gradients " << grads / gb << " GB + AdamW moments " << moments / gb << " GB";
    if (copy > 0) std::cout << " + " << dtype_name(policy.compute_dtype) << " copy " << copy / gb << " GB";
    std::cout << " = " << (weights + grads + moments + copy) / gb
              << " GB; activations come on top: one step runs next and is measured\n"
              << std::flush;
  }
  return plan;
}

int64_t schedule_steps(const RunFlags& f, int64_t total) {
  if (!f.resume) return total;
  const std::optional<std::string> latest =
      train::CheckpointManager((fs::path(f.output_dir) / "checkpoints").string()).latest();
  if (!latest) return total;
  const nlohmann::json meta = io::read_json_file((fs::path(*latest) / "meta.json").string());
  const nlohmann::json extra = meta.value("extra", nlohmann::json::object());
  const int64_t planned = extra.is_object() ? extra.value("schedule_steps", int64_t(0)) : 0;
  if (planned <= 0 || planned == total) return total;
  if (f.reschedule) {
    if (dist::world().rank() == 0)
      std::cerr << "meshtrain: --reschedule: the learning-rate schedule planned for " << planned
                << " steps now spans " << total << " (the rate jumps to its place on the new schedule)\n";
    return total;
  }
  if (dist::world().rank() == 0)
    std::cerr << "meshtrain: resuming a run planned for " << planned << " steps with " << total
              << " steps: the learning rate keeps its " << planned << "-step schedule"
              << (total > planned ? " (it stays at the schedule's final value after step " + std::to_string(planned) + ")"
                                  : " (the run ends before the schedule does)")
              << "; --reschedule fits it to " << total << " steps instead\n";
  return planned;
}

int64_t fitting_warmup(int64_t warmup, int64_t total, const char* command) {
  if (warmup < total) return warmup;
  // At least a step, but below the run (a one-step run has no room to warm up).
  const int64_t scaled = std::min(std::max<int64_t>(1, total / 10), total - 1);
  if (dist::world().rank() == 0)
    std::cerr << "meshtrain: [" << command << "] --warmup-steps " << warmup << " is not below the run's " << total
              << (total == 1 ? " step" : " steps") << ": warming up over " << scaled << (scaled == 1 ? " step" : " steps")
              << (scaled == total / 10 ? " (a tenth of the run)" : "") << " instead\n";
  return scaled;
}

void check_output_dir(const RunFlags& f, const char* command) {
  MT_CHECK(!fs::exists(f.output_dir) || fs::is_directory(f.output_dir), "[", command, "] --output-dir ", f.output_dir,
           " is a file, not a directory");
  const fs::path checkpoints = fs::path(f.output_dir) / "checkpoints";
  const bool has_checkpoints = !train::CheckpointManager(checkpoints.string()).all().empty() || fs::exists(checkpoints / "best");
  if (f.resume && !has_checkpoints && dist::world().rank() == 0)
    std::cerr << "meshtrain: --resume: " << checkpoints.string()
              << " holds no checkpoint (the run ended or was killed before its first one); starting fresh\n";
  if (!has_checkpoints || f.resume) return;
  MT_CHECK(f.overwrite, "[", command, "] ", checkpoints.string(),
           " holds checkpoints of an earlier run: pass --resume to continue it, --overwrite to discard it, or another "
           "--output-dir");
  dist::world().barrier();  // every rank has looked before rank 0 deletes
  if (dist::world().rank() == 0) {
    // Everything a run writes, so nothing of the discarded run mixes into the new one.
    fs::remove_all(checkpoints);
    fs::remove_all(fs::path(f.output_dir) / "tensorboard");
    fs::remove_all(fs::path(f.output_dir) / "model");
    for (const char* file : {"metrics.jsonl", "samples.txt", "eval_results.json"}) fs::remove(fs::path(f.output_dir) / file);
  }
  dist::world().barrier();
}

void add_step_flags(CLI::App* cmd, StepFlags& f) {
  // Also under Hugging Face's names (--max_steps, --num_train_epochs, ...), which its users type.
  auto* steps = cmd->add_option("--steps,--max-steps", f.steps, "optimizer steps (default: --epochs over the data)");
  auto* epochs = cmd->add_option("--epochs,--num-train-epochs", f.epochs, "passes over the data")->capture_default_str();
  steps->excludes(epochs)->check(positive());
  epochs->excludes(steps)->check(positive());
  cmd->add_option("--per-device-batch-size,--per-device-train-batch-size", f.per_device_batch_size,
                  "sequences per step on each data-parallel rank")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--grad-accum", f.grad_accum, "micro-batches per optimizer step")->capture_default_str()->check(positive());
}

int64_t plan_fit(const StepFlags& flags, int64_t train_size, const train::Deployer& deployer, train::FitOptions& f) {
  f.per_device_batch_size = flags.per_device_batch_size;
  f.grad_accum_steps = flags.grad_accum;
  f.epochs = flags.epochs;
  f.max_steps = flags.steps > 0 ? flags.steps : -1;
  train::StepPlan plan = train::plan_steps(train_size, f, deployer);
  if (flags.steps > 0) {  // as many epochs as the requested steps need
    f.epochs = (flags.steps + plan.steps_per_epoch - 1) / plan.steps_per_epoch;
    plan = train::plan_steps(train_size, f, deployer);
  }
  return plan.total_steps;
}

std::string loss_scale_error(const std::string& text) {
  if (text == "dynamic") return "";
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && std::isfinite(v) && v > 0) return "";
  } catch (const std::exception&) {
  }
  return "expected dynamic or a positive number, got '" + text + "'";
}

void apply_run_flags(const RunFlags& flags, train::FitOptions& f) {
  f.resume = flags.resume;
  f.progress_every = flags.logging_steps;
  f.read_loss_every = flags.read_loss_every;
  f.profile_steps = flags.profile;
  f.log_mfu = true;
  f.peak_gflops = flags.peak_gflops;
  f.dry_run = flags.dry_run;
  if (flags.checkpoint_writes != "auto") f.background_checkpoints = flags.checkpoint_writes == "background";
  f.cuda_graphs = train::parse_cuda_graphs(flags.cuda_graphs);
  const bool scaled = precision_policy_from_name(flags.precision, "--precision").loss_scaling;
  MT_CHECK(scaled || (flags.loss_scale == "dynamic" && flags.loss_scale_window == optim::LossScaleOptions{}.growth_interval),
           "[--loss-scale] loss scaling applies to --precision f16 (bf16 has f32's range and needs none); this run "
           "is --precision ", flags.precision);
  f.loss_scale.dynamic = flags.loss_scale == "dynamic";
  if (!f.loss_scale.dynamic) f.loss_scale.init_scale = std::stod(flags.loss_scale);
  f.loss_scale.growth_interval = flags.loss_scale_window;
}

optim::Transform gradient_clipping(double max_grad_norm) {
  return max_grad_norm > 0 ? optim::clip_by_global_norm(max_grad_norm) : optim::identity();
}

Params gathered_params(const train::Trainer& trainer, const train::Deployer& deployer) {
  Params host;
  for (const auto& [path, a] : trainer.params()) {
    Array whole = dist::to_host(a);
    if (deployer.is_main()) host.set(path, std::move(whole));
  }
  return host;
}

void export_model(const train::Trainer& trainer, const train::Deployer& deployer, const models::PretrainedModel& model,
                  const std::string& dir, DType dtype) {
  if (model.config.lora().enabled()) {
    MT_CHECK(!model.params.empty(), "[export] ", dir, ": a LoRA model is merged from its gathered parameters");
    if (deployer.is_main()) models::save_pretrained(model, dir, dtype);
    return;
  }
  const Params& params = trainer.params();
  models::save_pretrained_streamed(
      model, params, [&](const std::string& path) { return dist::to_host(params.at(path)); }, dir, dtype,
      deployer.is_main());
}

void add_adamw_flags(CLI::App* cmd, AdamWFlags& flags) {
  cmd->add_option("--learning-rate", flags.learning_rate, "peak learning rate (warmup, then cosine to 10%)")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", flags.warmup_steps, "linear warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", flags.weight_decay, "AdamW weight decay")->capture_default_str();
  add_max_grad_norm_flag(cmd, flags.max_grad_norm);
}

WarmupCosineAdamW warmup_cosine_adamw(const AdamWFlags& flags, int64_t span, const char* command,
                                      const std::function<optim::Transform(optim::Transform)>& wrap) {
  const int64_t warmup = fitting_warmup(flags.warmup_steps, span, command);
  optim::Schedule lr =
      optim::warmup_cosine_decay_schedule(0.0, flags.learning_rate, warmup, span, flags.learning_rate * 0.1);
  optim::Transform adamw = optim::adamw(lr, 0.9, 0.999, 1e-8, flags.weight_decay);
  return {lr, optim::chain({gradient_clipping(flags.max_grad_norm), wrap ? wrap(std::move(adamw)) : std::move(adamw)})};
}

void add_max_grad_norm_flag(CLI::App* cmd, double& value) {
  cmd->add_option("--max-grad-norm", value, "clip gradients to this global norm (0: no clipping)")
      ->capture_default_str()
      ->check(non_negative());
}

void apply_remat(const RunFlags& flags, models::PretrainedModel& model) {
  model.config = model.config.with_remat(parse_remat(flags.remat));
}

}  // namespace mt::cli
