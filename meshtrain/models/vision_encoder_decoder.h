#pragma once
// Hugging Face's VisionEncoderDecoderModel with a ViT encoder and a GPT-2 decoder whose blocks
// cross-attend to the image (the layout of the ViT-GPT2 captioning checkpoints):
//   encoder.*          a ViTModel (vit.h with prefix "encoder."; the pooler HF stores, which
//                      nothing reads, is dropped on load),
//   enc_to_dec_proj.{weight,bias}   a Linear when the widths differ,
//   decoder.transformer.*           GPT-2 with add_cross_attention (gpt2.h), its head tied to
//                                   decoder.transformer.wte (files may hold decoder.lm_head.weight).
// config.json: model_type "vision-encoder-decoder", "encoder" and "decoder" sub-configs,
// decoder_start_token_id, pad_token_id, eos_token_id.
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/autodiff/remat.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/models/gpt2.h"
#include "meshtrain/models/lora_options.h"
#include "meshtrain/models/vit.h"

namespace mt::models {

struct VisionEncoderDecoderConfig {
  LoraOptions lora{};
  Remat remat = Remat::none;
  VitConfig encoder;
  Gpt2Config decoder;
  int64_t decoder_start_token_id = 50256;
  int64_t pad_token_id = 50256;
  int64_t eos_token_id = 50256;

  bool projects() const { return encoder.hidden_size != decoder.n_embd; }
  // The sub-configs as this model runs them (its adapters and remat passed down).
  VitConfig encoder_config() const;
  Gpt2Config decoder_config() const;

  static VisionEncoderDecoderConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  void validate() const;
};

std::vector<ParamDef> vision_encoder_decoder_param_defs(const VisionEncoderDecoderConfig& c);

// The image's states as the decoder reads them: ViT's last hidden state (B, N + 1, D_enc),
// projected to the decoder's width where they differ.
Array vision_encode(const VisionEncoderDecoderConfig& c, const Params& p, const Array& pixel_values,
                    const RngKey& dropout_key = {}, bool train = false);
// Decoder logits (B, T, V) for decoder_input_ids given the encoded image (teacher forcing when
// training; one step at a time with a KV cache when generating).
Array vision_decoder_logits(const VisionEncoderDecoderConfig& c, const Params& p, const DecoderInputs& in,
                            const RngKey& dropout_key = {}, bool train = false, KvCache* cache = nullptr);
// Both: logits (B, T, V) of decoder_input_ids (B, T) for pixel_values (B, C, H, W).
Array vision_encoder_decoder_logits(const VisionEncoderDecoderConfig& c, const Params& p, const Array& pixel_values,
                                    const Array& decoder_input_ids, const Array& decoder_attention_mask = Array(),
                                    const RngKey& dropout_key = {}, bool train = false);
// The model as an encoder-decoder for generation (seq2seq_generate.h's generate_from_encoded):
// decode runs the GPT-2 decoder against a cache of its self-attention keys/values and of each
// layer's cross-attention keys/values, projected from the image states once. encode, which
// takes token ids, is not available: images go through vision_encode.
Seq2SeqLm vision_seq2seq_lm(const VisionEncoderDecoderConfig& c, const Params& p);
// Captions (token ids, the start token excluded) for pixel_values (B, C, H, W): greedy,
// sampling or beam search as `config` says.
GenerationResult generate_captions(const VisionEncoderDecoderConfig& c, const Params& p, const Array& pixel_values,
                                   const GenerationConfig& config = {});

}  // namespace mt::models
