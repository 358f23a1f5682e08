// `meshtrain tokenize`: encodes lines from stdin (a pair is two tab-separated fields) and
// prints one JSON object per line with input_ids, token_type_ids and attention_mask.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "apps/meshtrain/commands.h"
#include "apps/meshtrain/run_flags.h"
#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  bool pair = false;
  int max_length = 0;
  bool no_special_tokens = false;
};

void append_ids(std::string& out, const char* key, const std::vector<int32_t>& ids) {
  out += '"';
  out += key;
  out += "\":[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
}

// Padding uses the tokenizer's own settings when its file has them, else its pad token.
tokenizers::PaddingParams padding_for(const tokenizers::Tokenizer& tok, size_t length) {
  tokenizers::PaddingParams p = tok.padding().value_or(tokenizers::PaddingParams{});
  if (!tok.padding()) {
    for (const char* name : {"[PAD]", "<pad>", "<|padding|>"})
      if (auto id = tok.token_to_id(name)) {
        p.pad_id = *id;
        p.pad_token = name;
        break;
      }
  }
  p.length = length;
  return p;
}

void run_tokenize(const TokenizeOptions& o) {
  print_cpu_line();
  auto tok = tokenizers::load_tokenizer(o.tokenizer);
  MT_CHECK(o.max_length >= 0, "[tokenize] --max-length must be positive, got ", o.max_length);
  if (o.max_length > 0) {
    tok->set_truncation(tokenizers::TruncationParams{size_t(o.max_length)});
    tok->set_padding(padding_for(*tok, size_t(o.max_length)));
  }
  const bool special = !o.no_special_tokens;
  std::ios::sync_with_stdio(false);
  std::string line, out;
  size_t line_no = 0;
  std::vector<std::string> singles;
  std::vector<std::pair<std::string, std::string>> pairs;
  // Lines are encoded in chunks, on all cores, and printed in input order.
  auto flush = [&] {
    const auto encs = o.pair ? tok->encode_batch(pairs, special) : tok->encode_batch(singles, special);
    out.clear();
    for (const auto& e : encs) {
      out += '{';
      append_ids(out, "input_ids", e.ids);
      out += ',';
      append_ids(out, "token_type_ids", e.type_ids);
      out += ',';
      append_ids(out, "attention_mask", e.attention_mask);
      out += "}\n";
    }
    std::cout << out;
    singles.clear();
    pairs.clear();
  };
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (o.pair) {
      const size_t tab = line.find('\t');
      MT_CHECK(tab != std::string::npos, "[tokenize] line ", line_no,
               ": --pair expects two tab-separated fields, found no tab");
      pairs.emplace_back(line.substr(0, tab), line.substr(tab + 1));
    } else {
      singles.push_back(line);
    }
    if (singles.size() + pairs.size() >= 4096) flush();
  }
  if (!singles.empty() || !pairs.empty()) flush();
  std::cout.flush();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand(
      "tokenize", "Tokenize lines from stdin (with --pair, two tab-separated fields per line); prints one JSON object "
                  "per line with input_ids, token_type_ids and attention_mask");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json, vocab.txt, vocab.json/encoder.json, a SentencePiece .model, or a directory")
      ->required();
  cmd->add_flag("--pair", o->pair, "each line is a pair: two tab-separated fields");
  cmd->add_option("--max-length", o->max_length, "truncate (longest_first) and pad to this many tokens");
  cmd->add_flag("--no-special-tokens", o->no_special_tokens, "do not add [CLS]/[SEP]-style special tokens");
  cmd->callback([o] { run_tokenize(*o); });
}

}  // namespace mt::cli
