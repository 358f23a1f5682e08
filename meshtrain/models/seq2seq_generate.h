#pragma once
// Generation for encoder-decoders (T5, BART): the sources are encoded once, right-padded
// with the model's pad id; every row's decoder starts from decoder_start_token_id and runs
// against a cache of its self-attention keys/values and the cross-attention keys/values of
// its source (beam search expands and reorders them with the beams). Greedy, sampling and
// beam search with Hugging Face's semantics, as generate() for decoders (generate.h).
#include <cstdint>
#include <vector>

#include "meshtrain/models/generate.h"
#include "meshtrain/models/seq2seq.h"

namespace mt::models {

// New tokens per source (a final stop token included; the decoder start token is not).
// Defaults taken from the model where the config leaves them unset: stop tokens = its eos,
// forced_bos / forced_eos = its config's. The target length is bounded by
// config.max_new_tokens and the model's learned positions (BART). Throws mt::Error for an
// empty source, a token outside the vocabulary or a source longer than the model allows.
GenerationResult generate_seq2seq(const Seq2SeqLm& lm, const std::vector<std::vector<int64_t>>& sources,
                                  const GenerationConfig& config = {});

// The same from an encoder output already computed (an image encoder's states: lm.encode is
// not called). Rows follow the encoder output's.
GenerationResult generate_from_encoded(const Seq2SeqLm& lm, EncoderOutput encoded, const GenerationConfig& config = {});

// Right-pads sources to the longest: ids (B, S) and mask (B, S) i64.
// The model's logits cut to the first `vocab_size` ids (a vocabulary padded past the
// tokenizer's never yields an id it cannot decode); vocabulary-sharded logits are gathered.
Seq2SeqLm restrict_vocab(Seq2SeqLm lm, int64_t vocab_size);

std::pair<Array, Array> right_pad(const std::vector<std::vector<int64_t>>& sources, int64_t pad_token_id);

}  // namespace mt::models
