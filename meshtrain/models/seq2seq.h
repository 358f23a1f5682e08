#pragma once
// An encoder-decoder model (T5, BART) as training and generation see it, whatever the
// architecture: the encoder runs once per source batch, the decoder then runs over the
// target, either whole (teacher forcing) or one step at a time against a cache that holds
// its self-attention keys/values and the cross-attention keys/values of the source.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/models/common.h"

namespace mt::models {

// A teacher-forced batch:
//   input_ids              (B, S) source tokens, right-padded;
//   attention_mask         (B, S) 1 = token, 0 = padding; undefined = all tokens;
//   decoder_input_ids      (B, T) the target shifted right behind the decoder start token;
//   decoder_attention_mask (B, T) optional: the decoder is causal anyway, and padded target
//                          positions are excluded by -100 labels.
struct Seq2SeqInputs {
  Array input_ids{};
  Array attention_mask{};
  Array decoder_input_ids{};
  Array decoder_attention_mask{};
};

// The encoder's final hidden states (B, S, C) and the source padding mask as attention sees
// it: bool (B, 1, 1, S), or undefined when every source token is real.
struct EncoderOutput {
  Array hidden{};
  Array mask{};
  int64_t batch() const { return hidden.defined() ? hidden.dim(0) : 0; }
  // Row i of the result is row rows[i] (beam search expands and reorders sources).
  EncoderOutput select_rows(const std::vector<int64_t>& rows) const;
};

// What incremental decoding keeps between steps: per decoder layer, the self-attention keys
// and values of the positions decoded so far, and the cross-attention keys and values
// projected from the encoder output once.
struct Seq2SeqCache {
  KvCache self;
  std::vector<Array> cross_keys, cross_values;
  int64_t length() const { return self.length(); }
  void select_rows(const std::vector<int64_t>& rows);
  void clear() { self.clear(), cross_keys.clear(), cross_values.clear(); }
  // The cross-attention k, v of `layer`, computed by `project` on first use.
  std::pair<Array, Array> cross(size_t layer, const std::function<std::pair<Array, Array>()>& project);
};

struct Seq2SeqLm {
  std::string model_type;  // "t5", "bart"
  int64_t vocab_size = 0;
  int64_t max_source_positions = 0;  // learned position tables bound the lengths; 0 = no bound
  int64_t max_target_positions = 0;
  int64_t decoder_start_token_id = 0;
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 1;
  // Generation defaults from config.json (BART forces <s> first and </s> last).
  std::optional<int64_t> forced_bos_token_id, forced_eos_token_id;
  // Source ids (B, S) and mask (B, S) or undefined -> encoder output (evaluation mode).
  std::function<EncoderOutput(const Array& input_ids, const Array& attention_mask)> encode;
  // Decoder ids (B, T) -> logits (B, T, V). With a cache holding P earlier positions the ids
  // are positions P..P+T-1 and the cache receives them; `cache` may be null.
  std::function<Array(const Array& decoder_ids, const EncoderOutput& encoded, Seq2SeqCache* cache)> decode;
};

// The checks every encoder-decoder's forward makes, with errors naming `model` ("t5"):
// integer (B, S) source ids and a matching (B, S) attention mask -> the mask as attention
// takes it (EncoderOutput::mask);
Array source_mask(const Array& input_ids, const Array& attention_mask, const char* model);
// integer (B, T) decoder ids of the encoder output's batch, and an optional decoder mask
// covering the `past` cached positions and these -> that mask as attention takes it.
Array decoder_self_mask(const Array& decoder_ids, const EncoderOutput& enc, const Array& decoder_attention_mask,
                        int64_t past, const char* model);

// Hugging Face's shift_tokens_right: (B, T) labels -> decoder inputs [start, labels[:-1]],
// with -100 (ignored labels) replaced by the pad id.
Array shift_right(const Array& labels, int64_t decoder_start_token_id, int64_t pad_token_id);
// The same from the labels' host values (rows × cols, row-major): what a collate that has them
// calls, so the labels it just made are not read back from a GPU on its loader thread.
Array shift_right(const std::vector<int64_t>& labels, int64_t rows, int64_t cols, int64_t decoder_start_token_id,
                  int64_t pad_token_id);

}  // namespace mt::models
