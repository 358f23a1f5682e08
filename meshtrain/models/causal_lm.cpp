#include "meshtrain/models/causal_lm.h"

#include "meshtrain/core/error.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

CausalLm gpt2_causal_lm(const Gpt2Config& c, const Params& p) {
  CausalLm lm;
  lm.model_type = "gpt2";
  lm.vocab_size = c.vocab_size;
  lm.max_positions = c.n_positions;
  lm.stop_tokens = {c.eos_token_id};
  lm.forward = [c, p](const DecoderInputs& in, KvCache* cache) { return gpt2_apply(c, p, in, {}, false, cache); };
  return lm;
}

CausalLm llama_causal_lm(const LlamaConfig& c, const Params& p) {
  CausalLm lm;
  lm.model_type = "llama";
  lm.vocab_size = c.vocab_size;
  lm.max_positions = c.max_position_embeddings;
  lm.stop_tokens = {c.eos_token_id};
  lm.forward = [c, p](const DecoderInputs& in, KvCache* cache) { return llama_apply(c, p, in, {}, false, cache); };
  return lm;
}

CausalLm minigpt_causal_lm(const MiniGptConfig& c, const Params& p) {
  CausalLm lm;
  lm.model_type = "minigpt";
  lm.vocab_size = c.vocab_size;
  lm.max_positions = c.maxlen;
  lm.forward = [c, p](const DecoderInputs& in, KvCache* cache) { return minigpt_apply(c, p, in, {}, false, cache); };
  return lm;
}

CausalLm restrict_vocab(CausalLm lm, int64_t vocab_size) {
  MT_CHECK(vocab_size > 0 && vocab_size <= lm.vocab_size, "[generate] cannot restrict a vocabulary of ", lm.vocab_size,
           " to ", vocab_size);
  if (vocab_size == lm.vocab_size) return lm;
  auto inner = std::move(lm.forward);
  lm.forward = [inner, vocab_size](const DecoderInputs& in, KvCache* cache) {
    return slice(inner(in, cache), -1, 0, vocab_size);
  };
  lm.vocab_size = vocab_size;
  return lm;
}

}  // namespace mt::models
