#include "meshtrain/models/vision_encoder_decoder.h"

#include "meshtrain/models/model_spec.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/models/seq2seq_generate.h"
#include "meshtrain/autodiff/node.h"

namespace mt::models {

namespace {

const char* kWhat = "vision-encoder-decoder config";

}  // namespace

VitConfig VisionEncoderDecoderConfig::encoder_config() const {
  VitConfig e = encoder;
  e.lora = lora, e.remat = remat;
  return e;
}

Gpt2Config VisionEncoderDecoderConfig::decoder_config() const {
  Gpt2Config d = decoder;
  d.lora = lora, d.remat = remat;
  return d;
}

VisionEncoderDecoderConfig VisionEncoderDecoderConfig::from_json(const nlohmann::json& j) {
  MT_CHECK(j.is_object() && j.contains("encoder") && j["encoder"].is_object() && j.contains("decoder") &&
               j["decoder"].is_object(),
           "[", kWhat, "] needs 'encoder' and 'decoder' objects (transformers' VisionEncoderDecoderConfig)");
  const std::string enc_type = j["encoder"].value("model_type", ""), dec_type = j["decoder"].value("model_type", "");
  // Each side parsed by its own registered model; the kinds this model composes are checked
  // on the parsed configs.
  nlohmann::json enc = j["encoder"];
  enc["architectures"] = {"ViTModel"};
  const ModelConfig encoder = model_spec(enc_type).parse_config(enc, PretrainedOptions{});
  const ModelConfig decoder = model_spec(dec_type).parse_config(j["decoder"], PretrainedOptions{});
  MT_CHECK(encoder.holds<VitConfig>(), "[", kWhat, "] encoder model_type '", enc_type, "' is not supported (a ViT is)");
  MT_CHECK(decoder.holds<Gpt2Config>(), "[", kWhat, "] decoder model_type '", dec_type, "' is not supported (GPT-2 is)");
  VisionEncoderDecoderConfig c;
  c.encoder = encoder.as<VitConfig>();
  // transformers builds a ViTModel with a pooler whose output nothing reads: its stored
  // weights are dropped on load (ignored_keys) rather than trained as dead parameters.
  c.encoder.add_pooling_layer = false;
  c.decoder = decoder.as<Gpt2Config>();
  c.decoder.add_cross_attention = true;
  MT_CHECK(!j["decoder"].contains("cross_attention_hidden_size") || j["decoder"]["cross_attention_hidden_size"].is_null(),
           "[", kWhat, "] decoder.cross_attention_hidden_size is not supported");
  c.decoder_start_token_id = config_get<int64_t>(j, "decoder_start_token_id", kWhat, c.decoder.bos_token_id);
  c.pad_token_id = config_get<int64_t>(j, "pad_token_id", kWhat, c.decoder.eos_token_id);
  c.eos_token_id = config_get<int64_t>(j, "eos_token_id", kWhat, c.decoder.eos_token_id);
  c.validate();
  return c;
}

nlohmann::json VisionEncoderDecoderConfig::to_json() const {
  nlohmann::json enc = encoder.to_json(), dec = decoder.to_json();
  enc.erase("architectures"), enc.erase("id2label"), enc.erase("label2id");
  dec["add_cross_attention"] = true;
  dec["is_decoder"] = true;
  return {{"model_type", "vision-encoder-decoder"},
          {"architectures", {"VisionEncoderDecoderModel"}},
          {"is_encoder_decoder", true},
          {"tie_word_embeddings", false},
          {"encoder", enc},
          {"decoder", dec},
          {"decoder_start_token_id", decoder_start_token_id},
          {"pad_token_id", pad_token_id},
          {"eos_token_id", eos_token_id}};
}

void VisionEncoderDecoderConfig::validate() const {
  encoder.validate();
  decoder.validate();
  MT_CHECK(decoder.add_cross_attention, "[", kWhat, "] the decoder needs add_cross_attention");
  for (int64_t id : {decoder_start_token_id, pad_token_id, eos_token_id})
    MT_CHECK(id >= 0 && id < decoder.vocab_size, "[", kWhat, "] token id ", id, " is outside the decoder's vocabulary (",
             decoder.vocab_size, ")");
}

std::vector<ParamDef> vision_encoder_decoder_param_defs(const VisionEncoderDecoderConfig& c) {
  c.validate();
  std::vector<ParamDef> d = vit_param_defs(c.encoder, "encoder.");
  if (c.projects()) {
    d.push_back({"enc_to_dec_proj.weight", {c.decoder.n_embd, c.encoder.hidden_size}, linear_role(ParamKind::dense),
                 InitKind::normal, c.decoder.initializer_range});
    d.push_back({"enc_to_dec_proj.bias", {c.decoder.n_embd}, vector_role(ParamKind::bias), InitKind::zeros});
  }
  for (ParamDef def : gpt2_param_defs(c.decoder)) {
    def.path = "decoder." + def.path;
    d.push_back(std::move(def));
  }
  return d;
}

Array vision_encode(const VisionEncoderDecoderConfig& c, const Params& p, const Array& pixel_values,
                    const RngKey& dropout_key, bool train) {
  Array states = vit_encoder(c.encoder_config(), p, pixel_values, dropout_key.fold_in(1), train, "encoder.");
  if (c.projects()) states = linear(states, p["enc_to_dec_proj.weight"], p["enc_to_dec_proj.bias"]);
  return states;
}

Array vision_decoder_logits(const VisionEncoderDecoderConfig& c, const Params& p, const DecoderInputs& in,
                            const RngKey& dropout_key, bool train, KvCache* cache) {
  const Params decoder = p.subtree("decoder");
  const Gpt2Config dc = c.decoder_config();
  return gpt2_head(dc, decoder,
                   keep_last_positions(gpt2_hidden(dc, decoder, in, dropout_key.fold_in(2), train, cache), in.logits_to_keep));
}

Seq2SeqLm vision_seq2seq_lm(const VisionEncoderDecoderConfig& c, const Params& p) {
  Seq2SeqLm lm;
  lm.model_type = "vision-encoder-decoder";
  lm.vocab_size = c.decoder.vocab_size;
  lm.max_target_positions = c.decoder.n_positions;
  lm.decoder_start_token_id = c.decoder_start_token_id;
  lm.pad_token_id = c.pad_token_id;
  lm.eos_token_id = c.eos_token_id;
  lm.encode = [](const Array&, const Array&) -> EncoderOutput {
    throw Error("[vision-encoder-decoder] the encoder takes pixel values: use vision_encode / generate_captions");
  };
  const Params decoder = p.subtree("decoder");
  const Gpt2Config dc = c.decoder_config();
  lm.decode = [dc, decoder](const Array& ids, const EncoderOutput& enc, Seq2SeqCache* cache) {
    const DecoderInputs in{.input_ids = ids, .encoder_hidden_states = enc.hidden};
    return gpt2_head(dc, decoder, gpt2_hidden(dc, decoder, in, {}, false, cache ? &cache->self : nullptr, cache));
  };
  return lm;
}

GenerationResult generate_captions(const VisionEncoderDecoderConfig& c, const Params& p, const Array& pixel_values,
                                   const GenerationConfig& config) {
  autodiff::NoGradGuard no_grad;
  EncoderOutput encoded{vision_encode(c, p, pixel_values), Array()};
  return generate_from_encoded(vision_seq2seq_lm(c, p), std::move(encoded), config);
}

Array vision_encoder_decoder_logits(const VisionEncoderDecoderConfig& c, const Params& p, const Array& pixel_values,
                                    const Array& decoder_input_ids, const Array& decoder_attention_mask,
                                    const RngKey& dropout_key, bool train) {
  const Array states = vision_encode(c, p, pixel_values, dropout_key, train);
  return vision_decoder_logits(
      c, p, {.input_ids = decoder_input_ids, .attention_mask = decoder_attention_mask, .encoder_hidden_states = states},
      dropout_key, train);
}

ModelSpec vision_encoder_decoder_model_spec() {
  ModelSpec s;
  s.model_type = "vision-encoder-decoder";
  s.kind = ModelKind::image_to_text;
  s.display_name = "ViT-GPT2";
  // The decoder's self-attention and MLP, and the encoder's layers, as each model's own targets.
  s.lora_targets =
      R"((encoder\.layer\.\d+\.(attention\.attention\.(query|key|value)|attention\.output\.dense|intermediate\.dense|output\.dense)|\.(attn\.c_attn|attn\.c_proj|crossattention\.(c_attn|q_attn|c_proj)|mlp\.c_fc|mlp\.c_proj))$)";
  s.parse_config = [](const nlohmann::json& j, const PretrainedOptions&) -> ModelConfig {
    return VisionEncoderDecoderConfig::from_json(j);
  };
  s.config_json = [](const ModelConfig& c) { return c.as<VisionEncoderDecoderConfig>().to_json(); };
  s.architecture = [](const ModelConfig&) -> std::string { return "VisionEncoderDecoderModel"; };
  s.param_defs = [](const ModelConfig& c) { return vision_encoder_decoder_param_defs(c.as<VisionEncoderDecoderConfig>()); };
  s.ignored_keys = [](const ModelConfig&) {
    return std::vector<std::string>{R"(decoder\.transformer\.h\.\d+\.(attn|crossattention)\.(masked_)?bias)",
                                    R"(encoder\.pooler\..*)"};
  };
  s.tied_keys = [](const ModelConfig&) {
    return std::vector<std::pair<std::string, std::string>>{{"decoder.transformer.wte.weight", "decoder.lm_head.weight"}};
  };
  // `caption --config small-vit-gpt2`: 32x32 images in 8x8 patches, a 4-layer ViT and GPT-2.
  s.small_config = [](int64_t vocab, int64_t context, int64_t eos) {
    const nlohmann::json enc = {{"model_type", "vit"},      {"hidden_size", 128},     {"num_hidden_layers", 4},
                                {"num_attention_heads", 4}, {"intermediate_size", 512}, {"image_size", 32},
                                {"patch_size", 8},          {"num_channels", 3}};
    const nlohmann::json dec = {{"model_type", "gpt2"}, {"vocab_size", vocab}, {"n_positions", context},
                                {"n_embd", 128},        {"n_layer", 4},        {"n_head", 4},
                                {"bos_token_id", eos},  {"eos_token_id", eos}, {"add_cross_attention", true}};
    return nlohmann::json{{"model_type", "vision-encoder-decoder"}, {"encoder", enc}, {"decoder", dec},
                          {"decoder_start_token_id", eos},         {"pad_token_id", eos}, {"eos_token_id", eos}};
  };
  return s;
}

}  // namespace mt::models
