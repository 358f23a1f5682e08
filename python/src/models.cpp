// Models and tokenizers from Python: from_pretrained gives a Model (the architecture and its
// config) and its parameters as a flat {Hugging Face name: Array} dict, kept apart as in
// Flax, so any parameters of the model's layout (a Trainer's, adapted ones) go through
// apply/loss/generate/save_pretrained.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "meshtrain/meshtrain.h"
#include "meshtrain/models/bert.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/models/seq2seq_generate.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/models/vision_encoder_decoder.h"
#include "meshtrain/models/vit.h"
#include "meshtrain/train/bleu.h"
#include "meshtrain/train/checkpoint_model.h"
#include "meshtrain/train/rouge.h"
#include "python/src/bindings.h"
#include "python/src/conversions.h"

namespace py = pybind11;
using namespace mt;

namespace {

using ParamDict = std::map<std::string, Array>;
using mt::python::key_of;
using mt::python::params_of;

// Parameters back to Python as a dict.
ParamDict map_of(const Params& p) {
  ParamDict d;
  for (const auto& [k, v] : p) d.emplace(k, v);
  return d;
}

Array optional(const std::optional<Array>& a) { return a.value_or(Array()); }

// A loaded architecture: config, tokenizer, stop tokens; its own parameters are handed out
// once and not kept by the Python object.
class Model {
 public:
  explicit Model(models::PretrainedModel m) : m_(std::move(m)) { m_.params = Params(); }

  std::string model_type() const { return m_.model_type; }
  std::string architecture() const { return m_.architecture; }
  std::string config_json() const { return m_.config_json().dump(); }
  std::shared_ptr<tokenizers::Tokenizer> tokenizer() const { return m_.tokenizer; }
  PyParamRoles param_roles() const { return {m_.param_roles()}; }

  Array apply(const ParamDict& params, const std::optional<Array>& input_ids, const std::optional<Array>& attention_mask,
              const std::optional<Array>& token_type_ids, const std::optional<Array>& decoder_input_ids,
              const py::object& key, bool training, const std::optional<Array>& pixel_values) const {
    const Params p = params_of(params);
    const RngKey k = key_of(key);
    py::gil_scoped_release release;  // the forward pass lets other Python threads run
    if (m_.config.holds<models::VisionEncoderDecoderConfig>()) {
      MT_CHECK(pixel_values && decoder_input_ids, "[", m_.model_type, "] an image-to-text model takes pixel_values and "
               "decoder_input_ids");
      return models::vision_encoder_decoder_logits(m_.config.as<models::VisionEncoderDecoderConfig>(), p, *pixel_values,
                                                   *decoder_input_ids, Array(), k, training);
    }
    if (m_.config.holds<models::VitConfig>()) {
      MT_CHECK(pixel_values.has_value(), "[", m_.model_type, "] ViT takes pixel_values");
      models::VitOutputs out = models::vit_apply(m_.config.as<models::VitConfig>(), p, *pixel_values, k, training);
      return out.logits.defined() ? out.logits : out.last_hidden_state;
    }
    MT_CHECK(input_ids.has_value(), "[", m_.model_type, "] apply needs input_ids");
    if (m_.is_causal_lm()) return m_.decoder_logits(p, {*input_ids, optional(attention_mask), Array()}, k, training);
    if (m_.is_seq2seq()) {
      MT_CHECK(decoder_input_ids.has_value(), "[", m_.model_type, "] an encoder-decoder needs decoder_input_ids");
      return m_.seq2seq_logits(p, {*input_ids, optional(attention_mask), *decoder_input_ids, Array()}, k, training);
    }
    MT_CHECK(m_.config.holds<models::BertConfig>(), "[model] apply does not know model_type '", m_.model_type, "'");
    models::BertInputs in;
    in.input_ids = *input_ids, in.attention_mask = optional(attention_mask), in.token_type_ids = optional(token_type_ids);
    models::BertOutputs out = models::bert_apply(m_.config.as<models::BertConfig>(), p, in, k, training);
    return out.logits.defined() ? out.logits : out.last_hidden_state;
  }

  Array loss(const ParamDict& params, const std::optional<Array>& input_ids, const std::optional<Array>& labels_in,
             const std::optional<Array>& attention_mask, const std::optional<Array>& decoder_input_ids,
             const py::object& key, bool training, const std::optional<Array>& pixel_values) const {
    const Params p = params_of(params);
    const RngKey k = key_of(key);
    MT_CHECK(labels_in.has_value(), "[", m_.model_type, "] loss needs labels");
    const Array& labels = *labels_in;
    if (m_.config.holds<models::VisionEncoderDecoderConfig>()) {
      // Image to text: the labels are the caption, the decoder reads them shifted right.
      MT_CHECK(pixel_values && decoder_input_ids, "[", m_.model_type, "] an image-to-text model's loss takes "
               "pixel_values, decoder_input_ids and labels");
      return cross_entropy(models::vision_encoder_decoder_logits(m_.config.as<models::VisionEncoderDecoderConfig>(), p,
                                                                 *pixel_values, *decoder_input_ids, Array(), k, training),
                           labels);
    }
    MT_CHECK(input_ids.has_value(), "[", m_.model_type, "] loss needs input_ids");
    if (m_.is_causal_lm()) {
      // Labels as transformers takes them (the inputs themselves): position t predicts t + 1,
      // so they are shifted left here and the last position ignored.
      MT_CHECK(labels.ndim() == 2, "[", m_.model_type, "] labels must be (B, T), got ", labels.str());
      const int64_t t = labels.dim(1);
      Array last = Array::full(Shape{labels.dim(0), 1}, -100.0, labels.dtype(), labels.device());
      Array shifted = t > 1 ? concatenate({slice(labels, 1, 1, t), last}, 1) : last;
      return m_.decoder_loss(p, {*input_ids, optional(attention_mask), Array()}, shifted, k, training);
    }
    MT_CHECK(m_.is_seq2seq(), "[", m_.model_type, "] loss is the language-modelling loss of decoders, encoder-decoders "
             "and image-to-text models; for an encoder, take cross_entropy of apply's logits");
    MT_CHECK(decoder_input_ids.has_value(), "[", m_.model_type, "] an encoder-decoder needs decoder_input_ids");
    return m_.seq2seq_loss(p, {*input_ids, optional(attention_mask), *decoder_input_ids, Array()}, labels, k, training);
  }

  std::vector<std::vector<int64_t>> generate(const ParamDict& params,
                                             const std::optional<std::vector<std::vector<int64_t>>>& prompts,
                                             int64_t max_new_tokens, double temperature, int64_t top_k, double top_p,
                                             int64_t num_beams, uint64_t seed,
                                             const std::optional<std::vector<int64_t>>& stop_tokens,
                                             const std::optional<Array>& pixel_values) const {
    models::PretrainedModel m = m_;
    m.params = params_of(params);
    models::GenerationConfig g;
    g.max_new_tokens = max_new_tokens, g.temperature = temperature, g.top_k = top_k, g.top_p = top_p;
    g.num_beams = num_beams, g.seed = seed;
    if (stop_tokens) g.stop_tokens = *stop_tokens;
    py::gil_scoped_release release;
    if (m.config.holds<models::VisionEncoderDecoderConfig>()) {
      // Captions of the images: the decoder starts from its start token.
      MT_CHECK(pixel_values.has_value() && !prompts, "[", m.model_type, "] an image-to-text model generates from "
               "pixel_values (no prompts)");
      const auto& c = m.config.as<models::VisionEncoderDecoderConfig>();
      g.pad_token_id = c.pad_token_id;
      return models::generate_captions(c, m.params, dist::to_host(*pixel_values), g).tokens;
    }
    MT_CHECK(prompts.has_value() && !pixel_values, "[", m.model_type, "] generate takes prompts (lists of token ids)");
    if (m.is_seq2seq()) return models::generate_seq2seq(m.seq2seq_lm(), *prompts, g).tokens;
    return models::generate(m.causal_lm(), *prompts, g).tokens;
  }

  void save_pretrained(const ParamDict& params, const std::string& dir, const std::string& dtype) const {
    models::PretrainedModel m = m_;
    m.params = params_of(params);
    models::save_pretrained(m, dir, dtype_from_name(dtype));
  }

  // LoRA: the model carrying the adapters' options, and params with fresh adapters (B zero).
  py::tuple add_lora(const ParamDict& params, int64_t rank, double alpha, double dropout, const std::string& targets,
                     bool use_rslora, const py::object& key) const {
    models::PretrainedModel m = m_;
    m.params = params_of(params);
    models::LoraOptions o;
    o.rank = rank, o.alpha = alpha, o.dropout = dropout, o.targets = targets, o.use_rslora = use_rslora;
    models::add_lora(m, o, key_of(key));
    ParamDict out = map_of(m.params);
    return py::make_tuple(Model(std::move(m)), out);
  }
  void save_adapter(const ParamDict& params, const std::string& dir, const std::string& base_model,
                    const std::vector<std::string>& modules_to_save) const {
    models::PretrainedModel m = m_;
    m.params = params_of(params);
    models::save_adapter(m, dir, base_model, modules_to_save);
  }
  py::tuple load_adapter(const ParamDict& params, const std::string& dir) const {
    models::PretrainedModel m = m_;
    m.params = params_of(params);
    models::load_adapter(m, dir);
    ParamDict out = map_of(m.params);
    return py::make_tuple(Model(std::move(m)), out);
  }
  py::tuple merge_lora(const ParamDict& params) const {
    models::PretrainedModel m = m_;
    m.params = params_of(params);
    models::PretrainedModel merged = models::merge_lora(m);
    ParamDict out = map_of(merged.params);
    return py::make_tuple(Model(std::move(merged)), out);
  }

  ParamDict init(const py::object& key) const {
    models::PretrainedOptions o;
    o.init_key = key_of(key);
    o.load_tokenizer = false;
    return map_of(models::init_model(m_.config_json(), o).params);
  }

 private:
  models::PretrainedModel m_;
};

py::tuple from_pretrained(const std::string& path, const std::string& dtype, std::optional<int64_t> num_labels,
                          bool allow_new_params) {
  models::PretrainedOptions o;
  o.dtype = dtype_from_name(dtype);
  o.num_labels = num_labels;
  o.new_params = allow_new_params ? models::NewParams::heads : models::NewParams::none;
  // A meshtrain run or checkpoint directory too, as the CLI's generate, eval and serve take.
  models::PretrainedModel m = train::is_checkpoint_path(path)
                                  ? train::load_checkpoint_model(path, dist::Mesh::single(), o)
                                  : models::from_pretrained(path, o);
  ParamDict params = map_of(m.params);
  return py::make_tuple(Model(std::move(m)), params);
}

// A model of this config.json content with freshly initialized parameters.
py::tuple init_model(const std::string& config_json, const py::object& key) {
  models::PretrainedOptions o;
  o.init_key = key_of(key);
  o.load_tokenizer = false;
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("[init_model] the config is not JSON: ") + e.what());
  }
  models::PretrainedModel m = models::init_model(config, o);
  ParamDict params = map_of(m.params);
  return py::make_tuple(Model(std::move(m)), params);
}

}  // namespace

void bind_models(py::module_& m) {
  py::class_<tokenizers::Tokenizer, std::shared_ptr<tokenizers::Tokenizer>>(m, "Tokenizer")
      .def_static("from_file", [](const std::string& path) { return tokenizers::load_tokenizer(path); },
                  py::arg("path"))
      .def("encode",
           [](const tokenizers::Tokenizer& t, const std::string& text, bool add_special_tokens) {
             std::vector<int32_t> ids = t.encode(text, add_special_tokens).ids;
             return std::vector<int64_t>(ids.begin(), ids.end());
           },
           py::arg("text"), py::arg("add_special_tokens") = true)
      .def("encode_batch",
           [](const tokenizers::Tokenizer& t, const std::vector<std::string>& texts, bool add_special_tokens) {
             std::vector<tokenizers::Encoding> e;
             {
               py::gil_scoped_release release;
               e = t.encode_batch(texts, add_special_tokens);
             }
             std::vector<std::vector<int64_t>> out;
             for (const auto& enc : e) out.emplace_back(enc.ids.begin(), enc.ids.end());
             return out;
           },
           py::arg("texts"), py::arg("add_special_tokens") = true)
      .def("decode",
           [](const tokenizers::Tokenizer& t, const std::vector<int64_t>& ids, bool skip_special_tokens) {
             std::vector<int32_t> v(ids.begin(), ids.end());
             return t.decode(v, skip_special_tokens);
           },
           py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def("enable_truncation",
           [](tokenizers::Tokenizer& t, size_t max_length) {
             t.set_truncation(tokenizers::TruncationParams{.max_length = max_length});
           },
           py::arg("max_length"))
      .def("enable_padding",
           [](tokenizers::Tokenizer& t, std::optional<size_t> length, int32_t pad_id, const std::string& pad_token,
              const std::string& direction, size_t pad_to_multiple_of) {
             MT_CHECK(direction == "right" || direction == "left", "[tokenizer] padding direction is 'right' or "
                      "'left', got '", direction, "'");
             tokenizers::PaddingParams p;
             p.length = length, p.pad_id = pad_id, p.pad_token = pad_token, p.pad_to_multiple_of = pad_to_multiple_of;
             p.direction = direction == "left" ? tokenizers::Side::left : tokenizers::Side::right;
             t.set_padding(p);
           },
           py::arg("length") = py::none(), py::arg("pad_id") = 0, py::arg("pad_token") = "[PAD]",
           py::arg("direction") = "right", py::arg("pad_to_multiple_of") = 0)
      .def("encode_batch_with_mask",
           [](const tokenizers::Tokenizer& t, const std::vector<std::string>& texts, bool add_special_tokens) {
             std::vector<tokenizers::Encoding> e;
             {
               py::gil_scoped_release release;
               e = t.encode_batch(texts, add_special_tokens);
             }
             std::vector<std::vector<int64_t>> ids, mask;
             for (const auto& enc : e) {
               ids.emplace_back(enc.ids.begin(), enc.ids.end());
               mask.emplace_back(enc.attention_mask.begin(), enc.attention_mask.end());
             }
             return py::make_tuple(ids, mask);
           },
           py::arg("texts"), py::arg("add_special_tokens") = true)
      .def_property_readonly("vocab_size", &tokenizers::Tokenizer::vocab_size)
      .def("token_to_id", &tokenizers::Tokenizer::token_to_id);

  py::module_ models_m = m.def_submodule("models", "models from Hugging Face folders, meshtrain runs and llama2.c files");
  py::class_<Model>(models_m, "Model")
      .def_property_readonly("model_type", &Model::model_type)
      .def_property_readonly("architecture", &Model::architecture)
      .def_property_readonly("config_json", &Model::config_json)
      .def_property_readonly("tokenizer", &Model::tokenizer)
      .def("param_roles", &Model::param_roles)
      .def("apply", &Model::apply, py::arg("params"), py::arg("input_ids") = py::none(),
           py::arg("attention_mask") = py::none(), py::arg("token_type_ids") = py::none(),
           py::arg("decoder_input_ids") = py::none(), py::arg("key") = py::none(), py::arg("training") = false,
           py::arg("pixel_values") = py::none())
      .def("loss", &Model::loss, py::arg("params"), py::arg("input_ids") = py::none(), py::arg("labels") = py::none(),
           py::arg("attention_mask") = py::none(), py::arg("decoder_input_ids") = py::none(),
           py::arg("key") = py::none(), py::arg("training") = false, py::arg("pixel_values") = py::none())
      .def("generate", &Model::generate,
           "Token ids of each prompt's continuation: the new tokens only (transformers' generate returns the "
           "prompt and the new tokens), up to max_new_tokens each; greedy at temperature 0, else sampled "
           "(top_k, top_p, seed); beam search with num_beams > 1; image-to-text models take pixel_values.",
           py::arg("params"), py::arg("prompts") = py::none(),
           py::arg("max_new_tokens") = 32, py::arg("temperature") = 0.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0,
           py::arg("num_beams") = 1, py::arg("seed") = 0, py::arg("stop_tokens") = py::none(),
           py::arg("pixel_values") = py::none())
      .def("save_pretrained", &Model::save_pretrained, py::arg("params"), py::arg("dir"), py::arg("dtype") = "f32")
      .def("init", &Model::init, py::arg("key") = py::none())
      .def("add_lora", &Model::add_lora, py::arg("params"), py::arg("rank") = 8, py::arg("alpha") = 8.0,
           py::arg("dropout") = 0.0, py::arg("targets") = "", py::arg("use_rslora") = false,
           py::arg("key") = py::none())
      .def("save_adapter", &Model::save_adapter, py::arg("params"), py::arg("dir"), py::arg("base_model") = "",
           py::arg("modules_to_save") = std::vector<std::string>{})
      .def("load_adapter", &Model::load_adapter, py::arg("params"), py::arg("dir"))
      .def("merge_lora", &Model::merge_lora, py::arg("params"));
  models_m.def("lora_parameter_pattern", &models::lora_parameter_pattern);
  models_m.def(
      "_small_seq2seq_config",
      [](const std::string& model_type, int64_t vocab_size, int64_t pad_id, int64_t eos_id) {
        const models::ModelSpec& spec = models::model_spec(model_type);
        MT_CHECK(spec.small_seq2seq_config, "[small_seq2seq_config] '", model_type, "' is not an encoder-decoder");
        return spec.small_seq2seq_config(vocab_size, pad_id, eos_id).dump();
      },
      py::arg("model_type"), py::arg("vocab_size"), py::arg("pad_id"), py::arg("eos_id"));

  py::module_ metrics = m.def_submodule("metrics", "evaluation metrics");
  metrics.def(
      "rouge",
      [](const std::vector<std::string>& targets, const std::vector<std::string>& predictions, bool use_stemmer) {
        const train::RougeScores r = train::mean_rouge(targets, predictions, use_stemmer);
        py::dict out;
        for (auto [name, s] : {std::pair<const char*, const train::RougeScore*>{"rouge1", &r.rouge1},
                               {"rouge2", &r.rouge2}, {"rougeL", &r.rougeL}, {"rougeLsum", &r.rougeLsum}})
          out[name] = py::dict(py::arg("precision") = s->precision, py::arg("recall") = s->recall,
                               py::arg("fmeasure") = s->fmeasure);
        return out;
      },
      py::arg("targets"), py::arg("predictions"), py::arg("use_stemmer") = false);
  models_m.def(
      "_small_config",
      [](const std::string& model_type, int64_t vocab_size, int64_t context, int64_t eos_id) {
        const models::ModelSpec& spec = models::model_spec(model_type);
        MT_CHECK(spec.small_config, "[small_config] '", model_type, "' has no small config");
        return spec.small_config(vocab_size, context, eos_id).dump();
      },
      py::arg("model_type"), py::arg("vocab_size"), py::arg("context"), py::arg("eos_id"));
  metrics.def(
      "bleu",
      [](const std::vector<std::string>& predictions, const std::vector<std::vector<std::string>>& references) {
        const train::BleuScore b = train::corpus_bleu(predictions, references);
        return py::dict(py::arg("score") = b.score, py::arg("precisions") = b.precisions,
                        py::arg("brevity_penalty") = b.brevity_penalty, py::arg("hypothesis_length") = b.hypothesis_length,
                        py::arg("reference_length") = b.reference_length);
      },
      py::arg("predictions"), py::arg("references"),
      "corpus BLEU-4 as sacrebleu computes it (13a tokenization); references[i] are prediction i's references");
  models_m.def("_init_model", &init_model, py::arg("config_json"), py::arg("key") = py::none());
  models_m.def("from_pretrained", &from_pretrained, py::arg("path"), py::arg("dtype") = "f32",
               py::arg("num_labels") = py::none(), py::arg("allow_new_params") = false);
}
