// `meshtrain distill`: knowledge distillation of a decoder teacher (Hugging Face directory,
// meshtrain run or llama2.c file; any size) into a student over the same tokenizer — a
// pretrained decoder (--student, fully or with LoRA) or a new one (--config) — on text or
// prompt/response rows (finetune's data flags): the student learns the teacher's softened
// next-token distributions mixed with the hard labels (posttrain/distillation.h). Reports the
// teacher's and the student's held-out cross-entropy before and after, and writes the student
// as finetune writes its model.
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/decoder_training.h"
#include "apps/meshtrain/lm_setup.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "apps/meshtrain/sft_data.h"
#include "meshtrain/autodiff/precision_policy.h"
#include "meshtrain/io/json.h"
#include "meshtrain/meshtrain.h"
#include "meshtrain/posttrain/distillation.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct DistillCommandOptions {
  std::string teacher, student, config;
  SftFlags data;
  LoraFlags lora;
  StepFlags length{0, 1, 8, 1};
  double temperature = 2.0;
  double alpha = 0.5;
  OptimizerFlags optimizer{0, 10};  // learning rate 0: 1e-3 for a new student or LoRA, 5e-5 for a pretrained one
  RunFlags run;
};

// A new student: --config's keys over a small decoder of the config's model_type (default:
// the teacher's), with the teacher's vocabulary exactly.
std::shared_ptr<models::PretrainedModel> new_student(const std::string& config_file, const models::PretrainedModel& teacher,
                                                     int64_t seq_len, std::optional<int64_t> eos, const RngKey& key) {
  const json user = io::read_json_file(config_file);
  MT_CHECK(user.is_object(), "[distill] ", config_file, ": a config must be a JSON object");
  const std::string type = user.value("model_type", teacher.model_type);
  const int64_t vocab = teacher.causal_lm().vocab_size;
  json c = decoder_config(type, config_file, vocab, seq_len, eos);
  c["vocab_size"] = vocab;  // not rounded: the logits must line up with the teacher's
  models::PretrainedOptions po;
  po.init_key = key;
  auto m = std::make_shared<models::PretrainedModel>(models::init_model(c, po));
  m->source = config_file;
  return m;
}

// What the student trains on: rows of a .jsonl/.csv/.tsv file as finetune reads them, or a
// text file or folder packed into sequences as pretrain reads it.
struct DistillData {
  std::shared_ptr<const data::Dataset> train, eval;
  std::string description;
  bool rows = false;  // rows read as finetune reads them (else text packed into full sequences: nothing to cut)
};

DistillData distill_data(const SftFlags& flags, const std::shared_ptr<tokenizers::Tokenizer>& tok, std::optional<int64_t> eos) {
  std::string ext = fs::path(flags.data).extension().string();
  for (char& ch : ext) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  std::ostringstream what;
  if (ext == ".jsonl" || ext == ".json" || ext == ".csv" || ext == ".tsv") {
    SftCorpus c = make_sft_corpus(flags, *tok, eos);
    what << c.rows - c.eval_rows << " train / " << c.eval_rows << " eval rows ("
         << (c.supervised ? "prompt/response, loss on responses" : "text") << ")";
    return {c.train, c.eval, what.str(), true};  // SftFlags::pad_multiple() already leaves packed rows whole
  }
  LmDataFlags lm;
  lm.data = flags.data;
  lm.seq_len = flags.seq_len;
  LmCorpus c = make_lm_corpus(lm, tok, flags.eval_fraction);
  what << c.num_tokens << " tokens, " << c.dataset->size() << " train / " << (c.eval_dataset ? c.eval_dataset->size() : 0)
       << " eval sequences";
  return {c.dataset, c.eval_dataset, what.str()};
}

std::string ce_line(const std::map<std::string, double>& m) {
  std::ostringstream line;
  line << std::setprecision(5) << "ce_loss " << m.at("eval_ce_loss") << ", kl " << m.at("eval_kl");
  return line.str();
}

void run(const DistillCommandOptions& o) {
  check_output_dir(o.run, "distill");
  train::arm_stop_request();
  posttrain::DistillOptions d{o.temperature, o.alpha};
  posttrain::check_distill_options(d);
  train::Deployer deployer = make_deployer(o.run);
  const auto precision = precision_scope(o.run.precision);
  models::PretrainedOptions po;
  po.print_report = deployer.is_main();
  auto teacher = load_decoder(o.teacher, po, "distill");
  MT_CHECK(teacher->tokenizer != nullptr, "[distill] the teacher ", o.teacher, " has no tokenizer");
  std::shared_ptr<tokenizers::Tokenizer> tok = teacher->tokenizer;
  std::optional<int64_t> eos = end_of_text_id(*tok);
  if (!eos && !teacher->causal_lm().stop_tokens.empty()) eos = teacher->causal_lm().stop_tokens[0];
  po.load_tokenizer = false;
  SftFlags data = o.data;
  data.seq_len = length_within_positions(data.seq_len, teacher->causal_lm().max_positions, "--seq-len", o.teacher,
                                         deployer, "distill");
  auto student = o.student.empty() ? new_student(o.config, *teacher, data.seq_len, eos, deployer.init_key())
                                   : load_decoder(o.student, po, "distill");
  posttrain::check_teacher(*teacher, *student);
  if (!o.student.empty())
    data.seq_len = length_within_positions(data.seq_len, student->causal_lm().max_positions, "--seq-len", o.student,
                                           deployer, "distill");

  const DistillData corpus = distill_data(data, tok, eos);
  if (o.lora.enabled()) models::add_lora(*student, o.lora.options(), deployer.init_key());
  apply_remat(o.run, *student);
  train::ShardingPlan plan = make_plan(deployer, student->params, student->param_roles(), o.run);
  // The teacher laid out by its own rules on the same mesh, in the compute dtype, once.
  const train::ShardingPlan teacher_plan = deployer.sharding_rules(teacher->params, teacher->param_roles());
  Params teacher_params = precision_policy().cast_for_compute(teacher_plan.shard(teacher->params));
  teacher->params = Params{};

  train::FitOptions f;
  const int64_t total = plan_fit(o.length, corpus.train->size(), deployer, f);
  const DecoderOptimizer opt = decoder_optimizer(o.optimizer, o.run, total, (o.lora.enabled() || o.student.empty()) ? 1e-3 : 5e-5,
                                                 o.lora, student->params, "distill");
  const std::string tokenizer_source = o.teacher;  // the student speaks the teacher's tokens
  int64_t teacher_size = 0;
  for (const auto& [path, p] : teacher_params) teacher_size += p.numel();
  std::ostringstream intro;
  intro << "distill: " << teacher->model_type << " teacher " << o.teacher << " (" << teacher_size << " parameters) into "
        << (o.student.empty() ? "a new " + student->model_type + " from " + o.config : student->model_type + " " + o.student)
        << " (" << (o.lora.enabled() ? "LoRA rank " + std::to_string(o.lora.rank) + ", " : std::string(""))
        << student->params.total_elements() << " parameters), temperature " << d.temperature << ", alpha " << d.alpha
        << "; " << data.data << ": " << corpus.description << ", " << total << " steps of " << o.length.per_device_batch_size * deployer.data_size() * o.length.grad_accum
        << (corpus.rows && data.pad_multiple() > 0 ? " sequences of up to " : " sequences of ") << data.seq_len
        << " on mesh " << deployer.mesh().str();
  deployer.log(intro.str());

  // --dry-run measures one step's memory on the first batch: at full length, the most any
  // batch cut after its last target can need.
  const int64_t pad_multiple = o.run.dry_run || !corpus.rows ? 0 : data.pad_multiple();
  train::Trainer trainer(deployer, lm_collate(pad_multiple),
                         posttrain::distillation_loss_fn(student, teacher, teacher_params, d), std::move(student->params),
                         opt.transform, plan);
  if (pad_multiple > 0) trainer.set_padded_fields(lm_padded_fields());
  if (corpus.eval && !o.run.dry_run) {
    // The teacher scored as a student of itself: its KL is 0 and its ce_loss the bar.
    train::Trainer teacher_eval(deployer, lm_collate(pad_multiple),
                                posttrain::distillation_loss_fn(teacher, teacher, teacher_params, d), teacher_params,
                                optim::sgd(optim::constant_schedule(0.0)));
    if (pad_multiple > 0) teacher_eval.set_padded_fields(lm_padded_fields());
    deployer.log("teacher eval: " + ce_line(teacher_eval.eval_metrics(corpus.eval, o.length.per_device_batch_size)));
    deployer.log("student eval before: " + ce_line(trainer.eval_metrics(corpus.eval, o.length.per_device_batch_size)));
  }
  f.eval_data = corpus.eval;
  apply_training_flags(o.optimizer, o.run, opt, *student, tokenizer_source, f);
  f.checkpoint_extra["distill"] = {{"teacher", fs::absolute(o.teacher).string()}, {"temperature", d.temperature}, {"alpha", d.alpha}};
  f.tokens_per_example = pad_multiple > 0 ? 0 : data.seq_len;
  train::FitResult r = trainer.fit(corpus.train, f);
  if (!r.evals.empty() && r.evals.back().count("eval_ce_loss")) deployer.log("student eval after: " + ce_line(r.evals.back()));

  export_trained_model(trainer, *student, o.lora, o.student.empty() ? std::string() : o.student, tokenizer_source, o.run, deployer);
}

}  // namespace

void add_distill_command(CLI::App& app) {
  auto o = std::make_shared<DistillCommandOptions>();
  o->run.output_dir = "runs/distill";
  CLI::App* cmd = app.add_subcommand(
      "distill", "distil a decoder teacher into a smaller student over the same tokenizer (soft targets + hard labels)");
  cmd->add_option("--teacher", o->teacher, "the teacher: model directory (Hugging Face or meshtrain run) or llama2.c .bin")
      ->required();
  auto* s = cmd->add_option("--student", o->student, "a pretrained student (model directory or run)");
  auto* c = cmd->add_option("--config", o->config,
                            "a new student: config.json keys (model_type defaults to the teacher's, the vocabulary is the teacher's)")
                ->check(CLI::ExistingFile);
  s->excludes(c);
  add_sft_data_flags(cmd, o->data);
  cmd->add_option("--temperature", o->temperature, "softmax temperature of both models' logits in the KL term")
      ->capture_default_str();
  cmd->add_option("--alpha", o->alpha, "the KL term's share of the loss (1 - alpha: the hard labels' cross-entropy)")
      ->capture_default_str();
  add_lora_flags(cmd, o->lora);
  add_step_flags(cmd, o->length);
  add_optimizer_flags(cmd, o->optimizer, "peak learning rate (default: 1e-3 for a new student or LoRA, 5e-5 for a pretrained one)");
  add_run_flags(cmd, o->run, true);
  cmd->callback([o, s, c] {
    MT_CHECK(!o->student.empty() || !o->config.empty(), "[distill] name the student: --student DIR or --config JSON");
    run(*o);
  });
}

}  // namespace mt::cli
