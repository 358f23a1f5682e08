#pragma once
// Hugging Face's token decoders for SentencePiece-style vocabularies, as a chain of steps
// over the token strings (each step maps the list of tokens to a new list; the result is
// their concatenation): Replace, ByteFallback (<0xNN> tokens back to bytes), Fuse, Strip
// and Metaspace, with the semantics of `tokenizers`' decode_chain.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt::tokenizers {

struct DecodeStep {
  enum class Kind { replace, byte_fallback, fuse, strip, metaspace };
  Kind kind = Kind::fuse;
  std::string pattern, content;  // replace: every `pattern` in a token becomes `content`
  uint32_t strip_char = ' ';     // strip: removes up to `start` leading and `stop` trailing strip_char
  size_t start = 0, stop = 0;
  std::string replacement = "\xE2\x96\x81";  // metaspace: this character reads as a space...
  bool drop_first_replacement = true;        // ...except in the first token (prepend_scheme != never)

  static DecodeStep replace_with(std::string pattern, std::string content);
  static DecodeStep byte_fallback_step();
  static DecodeStep fuse_step();
  static DecodeStep strip_step(uint32_t ch, size_t start, size_t stop);
  static DecodeStep metaspace_step(std::string replacement, bool drop_first_replacement);
};

class DecoderChain {
 public:
  DecoderChain() = default;
  explicit DecoderChain(std::vector<DecodeStep> steps) : steps_(std::move(steps)) {}
  bool empty() const { return steps_.empty(); }
  // The decoded text; without steps, tokens are joined with spaces (HF's decode without a decoder).
  std::string decode(const std::vector<std::string_view>& tokens) const;

 private:
  std::vector<DecodeStep> steps_;
};

// The byte a "<0xNN>" token stands for, or -1.
int byte_fallback_value(std::string_view token);

}  // namespace mt::tokenizers
