#include "meshtrain/tokenizers/tokenizer.h"

#include <algorithm>
#include <exception>

#include "meshtrain/core/error.h"

namespace mt::tokenizers {

Encoding Tokenizer::encode_sequence(std::string_view text, int32_t type_id, int32_t sequence_id) const {
  Encoding out;
  out.reserve(text.size() / 3 + 4);  // about one token per 4 bytes of text: rarely regrows
  if (!added_.has_pass(false)) {
    tokenize_segment(text, 0, type_id, sequence_id, out);
    return out;
  }
  std::vector<Split> splits;
  added_.split(text, false, splits);
  for (const auto& s : splits) {
    if (s.id >= 0) {
      out.push_back(s.id, added_.token_string(s.id), {int64_t(s.begin), int64_t(s.end)}, type_id, sequence_id,
                    false);
    } else {
      tokenize_segment(text.substr(s.begin, s.end - s.begin), int64_t(s.begin), type_id, sequence_id, out);
    }
  }
  return out;
}

Encoding Tokenizer::post_process(Encoding a, std::optional<Encoding> b, bool add_special_tokens) const {
  if (truncation_) {
    const size_t n_added = add_special_tokens ? post_.added_tokens(b.has_value()) : 0;
    MT_CHECK(truncation_->max_length >= n_added, "[tokenizer] truncation max_length ", truncation_->max_length,
             " is smaller than the ", n_added, " special tokens the post-processor adds");
    truncate_pair(a, b ? &*b : nullptr, truncation_->max_length - n_added, truncation_->strategy,
                  truncation_->direction);
  }
  if (add_special_tokens) return post_.apply(std::move(a), b ? &*b : nullptr);
  if (b) a.append(std::move(*b));
  return a;
}

namespace {

void pad_all(std::vector<Encoding>& encodings, const PaddingParams& p) {
  size_t length = 0;
  if (p.length) length = *p.length;
  else
    for (const auto& e : encodings) length = std::max(length, e.size());
  if (p.pad_to_multiple_of > 0 && length % p.pad_to_multiple_of != 0)
    length += p.pad_to_multiple_of - length % p.pad_to_multiple_of;
  for (auto& e : encodings) e.pad(length, p.pad_id, p.pad_type_id, p.pad_token, p.direction == Side::left);
}

// Runs fn(i) for i in [0, n) on all cores; the first exception is rethrown afterwards.
template <class Fn>
void parallel_for(size_t n, Fn fn) {
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 32)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    try {
      fn(size_t(i));
    } catch (...) {
#pragma omp critical(mt_tokenizer_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

Encoding Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<Encoding> out;
  out.push_back(post_process(encode_sequence(text, 0, 0), std::nullopt, add_special_tokens));
  if (padding_) pad_all(out, *padding_);
  return std::move(out[0]);
}

Encoding Tokenizer::encode_pair(std::string_view a, std::string_view b, bool add_special_tokens) const {
  std::vector<Encoding> out;
  out.push_back(post_process(encode_sequence(a, 0, 0), encode_sequence(b, 1, 1), add_special_tokens));
  if (padding_) pad_all(out, *padding_);
  return std::move(out[0]);
}

std::vector<Encoding> Tokenizer::encode_batch(std::span<const std::string> texts, bool add_special_tokens) const {
  std::vector<Encoding> out(texts.size());
  parallel_for(texts.size(), [&](size_t i) {
    out[i] = post_process(encode_sequence(texts[i], 0, 0), std::nullopt, add_special_tokens);
  });
  if (padding_) pad_all(out, *padding_);
  return out;
}

std::vector<Encoding> Tokenizer::encode_batch(std::span<const std::pair<std::string, std::string>> pairs,
                                              bool add_special_tokens) const {
  std::vector<Encoding> out(pairs.size());
  parallel_for(pairs.size(), [&](size_t i) {
    out[i] = post_process(encode_sequence(pairs[i].first, 0, 0), encode_sequence(pairs[i].second, 1, 1),
                          add_special_tokens);
  });
  if (padding_) pad_all(out, *padding_);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<int32_t> kept;
  std::vector<std::string_view> tokens;
  kept.reserve(ids.size());
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* t = added_.find_id(id)) {
      if (skip_special_tokens && t->special) continue;
      kept.push_back(id);
      tokens.push_back(added_.token_string(id));
      continue;
    }
    const std::string* tok = model_id_to_token(id);
    MT_CHECK(tok != nullptr, "[tokenizer] decode: id ", id, " is not in the vocabulary (size ", vocab_size(), ")");
    if (skip_special_tokens && model_is_special(id)) continue;
    kept.push_back(id);
    tokens.push_back(*tok);
  }
  return decode_tokens(kept, tokens);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.token_to_id(token)) return id;
  return model_token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (added_.find_id(id)) return added_.token_string(id);
  if (const std::string* t = model_id_to_token(id)) return *t;
  return std::nullopt;
}

int64_t Tokenizer::vocab_size() const {
  int64_t n = model_vocab_size();
  for (const auto& t : added_.tokens())
    if (!model_token_to_id(t.content)) ++n;
  return n;
}

void Tokenizer::set_truncation(std::optional<TruncationParams> params) {
  if (params) MT_CHECK(params->max_length > 0, "[tokenizer] truncation max_length must be positive");
  truncation_ = std::move(params);
}

void Tokenizer::set_padding(std::optional<PaddingParams> params) { padding_ = std::move(params); }

void Tokenizer::add_tokens(std::vector<AddedToken> tokens) {
  added_.set_normalized_pass(handles_normalized_added_tokens());
  for (auto& t : tokens) {
    MT_CHECK(!t.content.empty(), "[tokenizer] an added token cannot be empty");
    if (t.id < 0) {
      if (auto id = token_to_id(t.content)) {
        t.id = *id;
      } else {
        int32_t next = int32_t(model_vocab_size());
        for (const auto& a : added_.tokens()) next = std::max(next, a.id + 1);
        t.id = next;
      }
    }
    std::string pattern = t.normalized ? normalize_for_matching(t.content) : t.content;
    added_.add(std::move(t), std::move(pattern));
  }
}

void Tokenizer::add_special_tokens(const std::vector<std::string>& contents) {
  std::vector<AddedToken> tokens;
  for (const auto& c : contents) {
    AddedToken t;
    t.content = c;
    t.special = true;
    tokens.push_back(std::move(t));
  }
  add_tokens(std::move(tokens));
}

bool Tokenizer::newline_cuts_are_exact() const {
  if (!model_newline_cuts_are_exact()) return false;
  for (const AddedToken& t : added_.tokens())
    if (t.lstrip || t.content.find('\n') != std::string::npos) return false;
  return true;
}

}  // namespace mt::tokenizers
