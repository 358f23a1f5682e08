#include "meshtrain/models/causal_lm.h"

#include "meshtrain/core/error.h"
#include "meshtrain/ops/shape_ops.h"

namespace mt::models {

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
