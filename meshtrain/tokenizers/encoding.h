#pragma once
// The result of tokenizing one input (a sequence or a pair) and the steps that shape it
// after the model: special tokens (post-processor templates), truncation and padding,
// with the semantics of Hugging Face `tokenizers`.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mt::tokenizers {

using Offsets = std::pair<int64_t, int64_t>;  // [begin, end) byte offsets into the input text

struct Encoding {
  std::vector<int32_t> ids;
  std::vector<int32_t> type_ids;
  std::vector<int32_t> attention_mask;       // 1 for real tokens (special ones too), 0 for padding
  std::vector<int32_t> special_tokens_mask;  // 1 for special and padding tokens
  std::vector<std::string> tokens;
  // Byte offsets into the text of the token's own sequence; (0, 0) for special/pad tokens.
  std::vector<Offsets> offsets;
  // 0 or 1: which input the token comes from; -1 for special and padding tokens.
  std::vector<int32_t> sequence_ids;

  size_t size() const { return ids.size(); }
  void reserve(size_t n);
  void push_back(int32_t id, std::string token, Offsets offset, int32_t type_id, int32_t sequence_id, bool special);
  void append(const Encoding& other);
  void append(Encoding&& other);  // moves the token strings
  // Keeps `length` tokens from the right (drops the tail) or from the left (drops the head).
  void truncate(size_t length, bool from_left);
  // Pads to `length` tokens (no-op when already that long).
  void pad(size_t length, int32_t pad_id, int32_t pad_type_id, const std::string& pad_token, bool left);
};

enum class TruncationStrategy { longest_first, only_first, only_second };
enum class Side { right, left };

struct TruncationParams {
  size_t max_length = 512;  // counts the special tokens the post-processor adds
  TruncationStrategy strategy = TruncationStrategy::longest_first;
  Side direction = Side::right;  // which end loses tokens
};

struct PaddingParams {
  // nullopt pads a batch to its longest member ("longest"); a value pads to that length.
  std::optional<size_t> length;
  Side direction = Side::right;  // decoders generating from a batch want Side::left
  size_t pad_to_multiple_of = 0;
  int32_t pad_id = 0;
  int32_t pad_type_id = 0;
  std::string pad_token = "[PAD]";
};

TruncationStrategy parse_truncation_strategy(std::string_view name);  // "longest_first", ...

// Applies the truncation to the model's encodings of the first and (optional) second
// sequence; `max_length` here already excludes special tokens. Throws mt::Error when an
// only_first/only_second target cannot be shortened enough or is missing.
void truncate_pair(Encoding& a, Encoding* b, size_t max_length, TruncationStrategy strategy, Side direction);

// A post-processor in Hugging Face's TemplateProcessing form: a list of pieces, each a
// special token (with the ids it expands to) or sequence A/B, each with a type id.
// BertProcessing, RobertaProcessing and "no special tokens" are all templates.
class TemplateProcessing {
 public:
  struct Piece {
    bool is_sequence = false;
    int sequence = 0;            // 0 = $A, 1 = $B (when is_sequence)
    std::string special;         // special token name (when !is_sequence)
    int32_t type_id = 0;
  };
  struct SpecialToken {
    std::vector<int32_t> ids;
    std::vector<std::string> tokens;
  };

  TemplateProcessing();  // "$A" / "$A $B:1": no special tokens
  TemplateProcessing(std::vector<Piece> single, std::vector<Piece> pair,
                     std::vector<std::pair<std::string, SpecialToken>> special_tokens);
  // HF's string form: "[CLS] $A [SEP]" and "[CLS] $A [SEP] $B:1 [SEP]:1"; each special
  // token name must be in `special_tokens`.
  static TemplateProcessing parse(std::string_view single, std::string_view pair,
                                  std::vector<std::pair<std::string, SpecialToken>> special_tokens);
  static TemplateProcessing bert(const std::string& cls, int32_t cls_id, const std::string& sep, int32_t sep_id);

  // Number of special tokens added to a single sequence or a pair.
  size_t added_tokens(bool pair) const;
  Encoding apply(Encoding a, Encoding* b) const;  // consumes a and *b

 private:
  const SpecialToken& special(const std::string& name) const;
  std::vector<Piece> single_, pair_;
  std::vector<std::pair<std::string, SpecialToken>> special_tokens_;
};

}  // namespace mt::tokenizers
