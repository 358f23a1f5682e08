#pragma once
// A decoder forward pass's inputs (ids, padding mask, positions) and their resolution against
// a KV cache: position ids from the mask, the boolean attention mask, the bounds check.
#include <cstdint>

#include "meshtrain/core/array.h"

namespace mt::models {

struct KvCache;

// Inputs of a decoder forward pass. With a KV cache holding P earlier positions:
//   input_ids      (B, T) integers: the new tokens;
//   attention_mask (B, P + T) 1 = token, 0 = padding (left-padded batches); undefined = all;
//   position_ids   (B, T) or (T,); undefined = from the mask (cumsum - 1, padding at 1, as
//                  HF generate) or P + arange(T) without a mask.
//   encoder_hidden_states (B, S, C) floating: what a decoder with cross-attention blocks
//                  (GPT-2's add_cross_attention, the text side of an image captioner) attends to;
//   encoder_attention_mask (B, S) 1 = attend; undefined = all.
//   logits_to_keep: 0 = logits for every position; n > 0 = only for the last n (HF's
//                  logits_to_keep): generation reads only the last, and a prompt's other
//                  positions' logits cost a (T, V) GEMM and buffer (GPT-2, 400 tokens: 31
//                  GFLOP and 80 MB for nothing).
struct DecoderInputs {
  Array input_ids{};
  Array attention_mask{};
  Array position_ids{};
  Array encoder_hidden_states{};
  Array encoder_attention_mask{};
  int64_t logits_to_keep = 0;
};

// The last `keep` positions of hidden states (B, T, C) (all of them when keep is 0 or >= T):
// what a decoder's head needs under DecoderInputs::logits_to_keep.
Array keep_last_positions(const Array& hidden, int64_t keep);

// i64 (n,) = start, start + 1, ...
Array arange_ids(int64_t start, int64_t n);
// Positions (B, T) of the last T of the mask's columns: cumsum(mask) - 1, 1 at padding.
Array position_ids_from_mask(const Array& attention_mask, int64_t t);
// Bool (B, 1, 1, Tk) "attend" mask from an integer/bool/float (B, Tk) 0/1 attention mask;
// undefined in, undefined out.
Array padding_mask(const Array& attention_mask, const char* what);
// Validates decoder inputs against the cache and fills the position ids.
struct ResolvedDecoderInputs {
  Array ids;        // (B, T)
  Array positions;  // (B, T) or (T,)
  Array mask;       // bool (B, 1, 1, P + T) or undefined
  int64_t past = 0;
};
ResolvedDecoderInputs resolve_decoder_inputs(const DecoderInputs& in, const KvCache* cache, int64_t max_positions,
                                             const char* what);

}  // namespace mt::models
