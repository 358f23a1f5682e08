// `meshtrain generate`: text from a Hugging Face model directory (GPT-2, LLaMA, miniGPT), a
// llama2.c `.bin` checkpoint, or a meshtrain run / checkpoint directory (its newest checkpoint). --prompt needs a tokenizer (the directory's, or --tokenizer)
// and prints the decoded text; --prompt-ids prints the generated ids on one line; --image
// FILE (repeatable) prints an image-to-text model's caption of each file, one per line.
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/lora_flags.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/image_decode.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/models/vision_encoder_decoder.h"
#include "meshtrain/models/class_labels.h"
#include "meshtrain/models/vit.h"
#include "meshtrain/train/image_classifier_task.h"
#include "meshtrain/models/seq2seq_generate.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/caption_metrics.h"
#include "meshtrain/train/model_image_processor.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/seq2seq_task.h"

namespace mt::cli {
namespace {

struct GenerateOptions {
  std::string model, prompt, prompt_ids, tokenizer, stop_ids;
  std::vector<std::string> images;  // an image-to-text model captions these
  int64_t max_new_tokens = 64;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  uint64_t seed = 0;
  bool no_stop = false;
  bool allow_new_heads = false;
  std::string adapter;
  std::string precision = "f32";
  std::string device = "auto";
};

std::vector<int64_t> parse_ids(const std::string& text, const char* what) {
  std::istringstream in(text);
  std::vector<int64_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MT_CHECK(used == word.size(), "[generate] ", what, ": '", word, "' is not an integer token id");
    ids.push_back(v);
  }
  return ids;
}

models::GenerationConfig generation_config(const GenerateOptions& o) {
  models::GenerationConfig g;
  g.max_new_tokens = o.max_new_tokens;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.top_p = o.top_p;
  g.num_beams = o.num_beams;
  g.length_penalty = o.length_penalty;
  g.seed = o.seed;
  g.stop_tokens = parse_ids(o.stop_ids, "--stop-ids");
  g.ignore_model_stop_tokens = o.no_stop;
  return g;
}

// The class of each --image file by a ViT classifier (its id2label name), one line each.
void classify_images(const models::PretrainedModel& m, const GenerateOptions& o) {
  const auto& c = m.config.as<models::VitConfig>();
  std::vector<data::Image> images;
  for (const std::string& path : o.images) images.push_back(data::read_image(path));
  auto model = std::make_shared<const models::PretrainedModel>(m);
  const train::Batch out = train::image_classifier_predict_fn(model)(
      m.params, {{"pixel_values", data::pixel_values(images, train::model_image_processor(o.model, c.image_size))}});
  const std::vector<std::string> classes = models::class_names(c.num_labels, c.label_names);
  for (int64_t id : out["prediction"].to_ints()) std::cout << classes.at(size_t(id)) << "\n";
}

// Captions of --image files by an image-to-text model, one line each in the order given.
void caption_images(const models::PretrainedModel& m, const GenerateOptions& o,
                    const std::shared_ptr<tokenizers::Tokenizer>& tok) {
  MT_CHECK(m.config.holds<models::VisionEncoderDecoderConfig>(), "[generate] --image needs an image-to-text model (",
           models::model_types_text(models::ModelKind::image_to_text), "); ", o.model, " is model_type '", m.model_type, "'");
  MT_CHECK(tok != nullptr, "[generate] ", o.model, " has no tokenizer: pass --tokenizer PATH");
  const auto& c = m.config.as<models::VisionEncoderDecoderConfig>();
  const data::ImageProcessorConfig processor = train::model_image_processor(o.model, c.encoder.image_size);
  std::vector<data::Image> images;
  for (const std::string& path : o.images) images.push_back(data::read_image(path));
  models::GenerationConfig g = generation_config(o);
  g.pad_token_id = c.pad_token_id;
  const models::GenerationResult r = models::generate_captions(c, m.params, data::pixel_values(images, processor), g);
  for (const auto& ids : r.tokens) std::cout << train::caption_text(*tok, ids, c.eos_token_id, c.pad_token_id) << "\n";
}

void run(const GenerateOptions& o) {
  const auto precision = precision_scope(o.precision);
  set_default_device(Device::parse(o.device));  // the model loads there; generation runs there
  models::PretrainedOptions po;
  po.load_tokenizer = o.prompt_ids.empty() || !o.tokenizer.empty();
  if (o.allow_new_heads) po.new_params = models::NewParams::all;
  // A meshtrain run or checkpoint directory, else a Hugging Face directory or llama2.c file.
  models::PretrainedModel m = train::is_checkpoint_path(o.model)
                                  ? train::load_checkpoint_model(o.model, dist::Mesh::single(), po)
                                  : models::from_pretrained(o.model, po);
  apply_adapter(m, o.adapter, true);
  m.params = precision_policy().cast_for_compute(m.params);  // --precision bf16: bf16 weights
  if (!o.images.empty()) {
    if (m.config.holds<models::VitConfig>()) return classify_images(m, o);
    caption_images(m, o, o.tokenizer.empty() ? m.tokenizer : tokenizers::load_tokenizer(o.tokenizer));
    return;
  }
  MT_CHECK(m.is_causal_lm() || m.is_seq2seq(), "[generate] ", o.model, ": model_type '", m.model_type,
           "' cannot generate (use ", models::model_types_text(models::ModelKind::decoder), " or ",
           models::model_types_text(models::ModelKind::seq2seq), ")");
  std::shared_ptr<tokenizers::Tokenizer> tok = m.tokenizer;
  if (!o.tokenizer.empty()) tok = tokenizers::load_tokenizer(o.tokenizer);

  std::vector<int64_t> prompt;
  const bool text_mode = o.prompt_ids.empty();
  if (text_mode) {
    MT_CHECK(tok != nullptr, "[generate] ", o.model, " has no tokenizer: pass --tokenizer PATH or use --prompt-ids");
    if (m.is_seq2seq()) {
      // The source as the seq2seq command encodes it: the tokenizer's template, then </s>.
      prompt = train::seq2seq_ids(*tok, o.prompt, int64_t(1) << 30, m.seq2seq_lm().eos_token_id);
    } else {
      tokenizers::Encoding e = tok->encode(o.prompt);
      prompt.assign(e.ids.begin(), e.ids.end());
    }
    MT_CHECK(!prompt.empty(), "[generate] the prompt '", o.prompt, "' encodes to no tokens");
  } else {
    prompt = parse_ids(o.prompt_ids, "--prompt-ids");
    MT_CHECK(!prompt.empty(), "[generate] --prompt-ids is empty");
  }

  const models::GenerationConfig g = generation_config(o);
  // What would otherwise pass in silence (transformers warns alike).
  if (g.num_beams > 1 && (o.temperature > 0 || o.top_k > 0 || o.top_p < 1.0))
    std::cerr << "generate: beam search keeps the likeliest beams: --temperature, --top-k and --top-p are not used\n";
  models::GenerationResult r;
  if (m.is_seq2seq()) {
    // Encoder-decoders: the prompt is the source; the output is the decoder's tokens alone.
    models::Seq2SeqLm lm = m.seq2seq_lm();
    if (tok) lm = models::restrict_vocab(lm, std::min(lm.vocab_size, tok->vocab_size()));
    r = models::generate_seq2seq(lm, {prompt}, g);
  } else {
    models::CausalLm lm = m.causal_lm();
    if (tok) lm = models::restrict_vocab(lm, std::min(lm.vocab_size, tok->vocab_size()));
    r = models::generate(lm, {prompt}, g);
    const int64_t length = int64_t(prompt.size() + r.tokens[0].size());
    if (lm.max_positions > 0 && length >= lm.max_positions && int64_t(r.tokens[0].size()) < o.max_new_tokens)
      std::cerr << "generate: stopped after " << r.tokens[0].size() << " new tokens at the model's " << lm.max_positions
                << " positions (--max-new-tokens " << o.max_new_tokens << ")\n";
  }
  const std::vector<int64_t>& out = r.tokens[0];

  if (!text_mode) {
    for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? " " : "") << out[i];
    std::cout << "\n";
    return;
  }
  std::vector<int32_t> all;
  if (!m.is_seq2seq()) all.assign(prompt.begin(), prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  std::cout << tok->decode(all, true) << "\n";
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text from a decoder (HF directory, llama2.c .bin, meshtrain run), a summary/translation from an encoder-decoder (T5, BART: --prompt is the source), or captions of --image files (ViT-GPT2)");
  cmd->add_option("--model", o->model, "model directory (config.json + safetensors), llama2.c .bin, or a meshtrain run/checkpoint directory")->required();
  auto* text = cmd->add_option("--prompt", o->prompt, "prompt text (needs a tokenizer)");
  auto* ids = cmd->add_option("--prompt-ids", o->prompt_ids, "prompt token ids, e.g. \"1 2 3\" (prints ids)");
  auto* image = cmd->add_option("--image", o->images, "image models: caption (ViT-GPT2) or classify (ViT) these PNG/JPEG files, one line each")
                    ->check(CLI::ExistingFile);
  text->excludes(ids);
  ids->excludes(text);
  image->excludes(text);
  image->excludes(ids);
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy; > 0 samples from softmax(logits / T)")
      ->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass (1 = off)")->capture_default_str();
  cmd->add_option("--num-beams", o->num_beams, "beam search with this many beams (1 = off)")->capture_default_str();
  cmd->add_option("--length-penalty", o->length_penalty, "beam score = sum log p / length^penalty")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "sampling seed (runs are reproducible)")->capture_default_str();
  cmd->add_option("--stop-ids", o->stop_ids, "token ids that end generation (default: the model's end token)");
  cmd->add_flag("--no-stop", o->no_stop, "ignore the model's end token (generate max-new-tokens)");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file or directory (default: the model directory's)");
  add_allow_new_heads_flag(cmd, o->allow_new_heads);
  add_adapter_flag(cmd, o->adapter);
  add_precision_flag(cmd, o->precision);
  add_device_flag(cmd, o->device);
  cmd->callback([o] {
    MT_CHECK(!o->prompt.empty() || !o->prompt_ids.empty() || !o->images.empty(),
             "[generate] pass --prompt TEXT, --prompt-ids \"1 2 3\" or (image-to-text models) --image FILE");
    run(*o);
  });
}

}  // namespace mt::cli
