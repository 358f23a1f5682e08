#include "meshtrain/models/causal_lm.h"

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

}  // namespace mt::models
