#include "meshtrain/tokenizers/encoding.h"

#include <algorithm>

#include "meshtrain/core/error.h"

namespace mt::tokenizers {

void Encoding::reserve(size_t n) {
  ids.reserve(n);
  type_ids.reserve(n);
  attention_mask.reserve(n);
  special_tokens_mask.reserve(n);
  tokens.reserve(n);
  offsets.reserve(n);
  sequence_ids.reserve(n);
}

void Encoding::push_back(int32_t id, std::string token, Offsets offset, int32_t type_id, int32_t sequence_id,
                         bool special) {
  ids.push_back(id);
  type_ids.push_back(type_id);
  attention_mask.push_back(1);
  special_tokens_mask.push_back(special ? 1 : 0);
  tokens.push_back(std::move(token));
  offsets.push_back(offset);
  sequence_ids.push_back(sequence_id);
}

void Encoding::append(const Encoding& o) {
  auto cat = [](auto& dst, const auto& src) { dst.insert(dst.end(), src.begin(), src.end()); };
  cat(ids, o.ids);
  cat(type_ids, o.type_ids);
  cat(attention_mask, o.attention_mask);
  cat(special_tokens_mask, o.special_tokens_mask);
  cat(tokens, o.tokens);
  cat(offsets, o.offsets);
  cat(sequence_ids, o.sequence_ids);
}

void Encoding::append(Encoding&& o) {
  if (ids.empty()) {
    *this = std::move(o);
    return;
  }
  auto cat = [](auto& dst, const auto& src) { dst.insert(dst.end(), src.begin(), src.end()); };
  cat(ids, o.ids);
  cat(type_ids, o.type_ids);
  cat(attention_mask, o.attention_mask);
  cat(special_tokens_mask, o.special_tokens_mask);
  tokens.insert(tokens.end(), std::make_move_iterator(o.tokens.begin()), std::make_move_iterator(o.tokens.end()));
  cat(offsets, o.offsets);
  cat(sequence_ids, o.sequence_ids);
}

void Encoding::truncate(size_t length, bool from_left) {
  if (length >= ids.size()) return;
  auto cut = [&](auto& v) {
    if (from_left) v.erase(v.begin(), v.begin() + std::ptrdiff_t(v.size() - length));
    else v.resize(length);
  };
  cut(ids);
  cut(type_ids);
  cut(attention_mask);
  cut(special_tokens_mask);
  cut(tokens);
  cut(offsets);
  cut(sequence_ids);
}

void Encoding::pad(size_t length, int32_t pad_id, int32_t pad_type_id, const std::string& pad_token, bool left) {
  if (ids.size() >= length) return;
  const size_t n = length - ids.size();
  auto fill = [&](auto& v, const auto& value) {
    if (left) v.insert(v.begin(), n, value);
    else v.insert(v.end(), n, value);
  };
  fill(ids, pad_id);
  fill(type_ids, pad_type_id);
  fill(attention_mask, 0);
  fill(special_tokens_mask, 1);
  fill(tokens, pad_token);
  fill(offsets, Offsets{0, 0});
  fill(sequence_ids, -1);
}

TruncationStrategy parse_truncation_strategy(std::string_view name) {
  if (name == "longest_first" || name == "LongestFirst") return TruncationStrategy::longest_first;
  if (name == "only_first" || name == "OnlyFirst") return TruncationStrategy::only_first;
  if (name == "only_second" || name == "OnlySecond") return TruncationStrategy::only_second;
  throw Error(detail::concat("[tokenizer] unknown truncation strategy '", name,
                             "' (expected longest_first, only_first or only_second)"));
}

void truncate_pair(Encoding& a, Encoding* b, size_t max_length, TruncationStrategy strategy, Side direction) {
  const bool left = direction == Side::left;
  const size_t total = a.size() + (b ? b->size() : 0);
  if (total <= max_length) return;
  const size_t to_remove = total - max_length;
  if (strategy == TruncationStrategy::longest_first) {
    if (!b) {
      a.truncate(max_length, left);
      return;
    }
    // Shorten the longer sequence first; when both must be cut, split max_length evenly.
    // An odd token goes to the longer sequence, or to the second one when even the
    // shorter reaches max_length: this matches Hugging Face tokenizers 0.23 on every pair
    // of lengths of single-token words; on real text its choice of who keeps the odd
    // token also depends on the content (see the conformance test).
    size_t n1 = a.size(), n2 = b->size();
    const bool swap = n1 > n2;
    if (swap) std::swap(n1, n2);
    const bool shorter_fills = n1 >= max_length;
    n2 = n1 > max_length ? n1 : std::max(n1, max_length - n1);
    if (n1 + n2 > max_length) {
      n1 = max_length / 2;
      n2 = n1 + max_length % 2;
    }
    if (swap && !shorter_fills) std::swap(n1, n2);
    a.truncate(n1, left);
    b->truncate(n2, left);
    return;
  }
  Encoding* target = strategy == TruncationStrategy::only_first ? &a : b;
  MT_CHECK(target != nullptr, "[tokenizer] truncation only_second needs a second sequence");
  MT_CHECK(target->size() > to_remove, "[tokenizer] truncation ",
           strategy == TruncationStrategy::only_first ? "only_first" : "only_second", ": the ",
           strategy == TruncationStrategy::only_first ? "first" : "second", " sequence has ", target->size(),
           " tokens, too short to remove the ", to_remove, " needed to fit max_length");
  target->truncate(target->size() - to_remove, left);
}

TemplateProcessing::TemplateProcessing()
    : single_{{true, 0, "", 0}}, pair_{{true, 0, "", 0}, {true, 1, "", 1}} {}

TemplateProcessing::TemplateProcessing(std::vector<Piece> single, std::vector<Piece> pair,
                                       std::vector<std::pair<std::string, SpecialToken>> special_tokens)
    : single_(std::move(single)), pair_(std::move(pair)), special_tokens_(std::move(special_tokens)) {
  for (const auto* pieces : {&single_, &pair_})
    for (const auto& p : *pieces) {
      if (p.is_sequence) continue;
      const auto& sp = special(p.special);
      MT_CHECK(sp.ids.size() == sp.tokens.size(), "[tokenizer] template special token '", p.special, "' has ",
               sp.ids.size(), " ids but ", sp.tokens.size(), " tokens");
    }
}

const TemplateProcessing::SpecialToken& TemplateProcessing::special(const std::string& name) const {
  for (const auto& [n, t] : special_tokens_)
    if (n == name) return t;
  throw Error(detail::concat("[tokenizer] template uses special token '", name, "' that is not defined"));
}

TemplateProcessing TemplateProcessing::parse(std::string_view single, std::string_view pair,
                                             std::vector<std::pair<std::string, SpecialToken>> special_tokens) {
  auto parse_one = [](std::string_view spec) {
    std::vector<Piece> pieces;
    size_t i = 0;
    while (i < spec.size()) {
      while (i < spec.size() && spec[i] == ' ') ++i;
      size_t j = i;
      while (j < spec.size() && spec[j] != ' ') ++j;
      if (j == i) break;
      std::string_view item = spec.substr(i, j - i);
      i = j;
      Piece p;
      // "name:1" carries a type id; a bare "$" means $A, "$B" or "$1" the second sequence.
      const size_t colon = item.rfind(':');
      if (colon != std::string_view::npos && colon + 1 < item.size()) {
        const std::string digits(item.substr(colon + 1));
        MT_CHECK(digits.find_first_not_of("0123456789") == std::string::npos, "[tokenizer] bad template item '",
                 item, "' in '", spec, "'");
        p.type_id = std::stoi(digits);
        item = item.substr(0, colon);
      }
      if (!item.empty() && item[0] == '$') {
        p.is_sequence = true;
        const std::string_view which = item.substr(1);
        if (which.empty() || which == "A" || which == "0") p.sequence = 0;
        else if (which == "B" || which == "1") p.sequence = 1;
        else throw Error(detail::concat("[tokenizer] bad template sequence '", item, "' in '", spec, "'"));
        if (which == "1" && colon == std::string_view::npos) p.type_id = 1;
      } else {
        p.special = std::string(item);
      }
      pieces.push_back(std::move(p));
    }
    return pieces;
  };
  return TemplateProcessing(parse_one(single), parse_one(pair), std::move(special_tokens));
}

TemplateProcessing TemplateProcessing::bert(const std::string& cls, int32_t cls_id, const std::string& sep,
                                            int32_t sep_id) {
  std::vector<std::pair<std::string, SpecialToken>> sp{{cls, {{cls_id}, {cls}}}, {sep, {{sep_id}, {sep}}}};
  return TemplateProcessing({{false, 0, cls, 0}, {true, 0, "", 0}, {false, 0, sep, 0}},
                            {{false, 0, cls, 0}, {true, 0, "", 0}, {false, 0, sep, 0}, {true, 1, "", 1},
                             {false, 0, sep, 1}},
                            std::move(sp));
}

size_t TemplateProcessing::added_tokens(bool pair) const {
  size_t n = 0;
  for (const auto& p : pair ? pair_ : single_)
    if (!p.is_sequence) n += special(p.special).ids.size();
  return n;
}

Encoding TemplateProcessing::apply(Encoding a, Encoding* b) const {
  const auto& pieces = b ? pair_ : single_;
  Encoding out;
  out.reserve(a.size() + (b ? b->size() : 0) + added_tokens(b != nullptr));
  for (const auto& p : pieces) {
    if (p.is_sequence) {
      Encoding* src = p.sequence == 0 ? &a : b;
      MT_CHECK(src != nullptr, "[tokenizer] the single-sequence template refers to $B");
      const size_t start = out.size();
      out.append(std::move(*src));  // each sequence appears once in a template
      std::fill(out.type_ids.begin() + std::ptrdiff_t(start), out.type_ids.end(), p.type_id);
    } else {
      const auto& sp = special(p.special);
      for (size_t k = 0; k < sp.ids.size(); ++k) out.push_back(sp.ids[k], sp.tokens[k], {0, 0}, p.type_id, -1, true);
    }
  }
  return out;
}

}  // namespace mt::tokenizers
