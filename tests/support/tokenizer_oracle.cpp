#include "tests/support/tokenizer_oracle.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "meshtrain/core/error.h"

namespace mt::test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tokenizers::Encoding;
using tokenizers::Tokenizer;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// All conformance inputs, read once.
const std::vector<TextInput>& all_inputs() {
  static const std::string kData = MT_DATA_DIR;
  static const std::vector<TextInput> inputs = [] {
    std::vector<GlueFileStats> stats;
    auto in = glue_inputs(kData + "/glue", &stats);
    size_t rows = 0, skipped = 0, pairs = 0;
    for (const auto& s : stats) {
      rows += s.rows;
      skipped += s.skipped;
      if (s.skipped) std::cout << "[inputs] " << s.file << ": skipped " << s.skipped << " short rows\n";
    }
    for (const auto& x : in) pairs += x.b.has_value();
    std::cout << "[inputs] GLUE: " << stats.size() << " files, " << rows << " rows, " << in.size() << " inputs ("
              << pairs << " pairs, " << in.size() - pairs << " singles), " << skipped << " rows skipped\n";
    auto lines = text_lines(kData + "/text/tinyshakespeare.txt");
    std::cout << "[inputs] Tiny Shakespeare: " << lines.size() << " lines\n";
    in.insert(in.end(), lines.begin(), lines.end());
    return in;
  }();
  return inputs;
}


// Runs tests/python/hf_encode.py with `args` on the inputs; one Result per input. Repeated
// inputs (Tiny Shakespeare repeats many lines) go to the oracle once.
std::vector<Result> run_oracle(const std::string& args, const std::vector<TextInput>& inputs) {
  const std::string python = MT_VENV_PYTHON, oracle_dir = fs::path(python).parent_path().parent_path() / "tokenizers-oracle";
  if (!fs::exists(python) || !fs::exists(oracle_dir + "/tokenizers"))
    throw Error("[conformance] Hugging Face tokenizers is not installed in " + oracle_dir +
                " (run scripts/install-python-deps.sh)");
  char tmpl[] = "/tmp/mt_tok_oracle_XXXXXX";
  const char* tmp = mkdtemp(tmpl);
  if (!tmp) throw Error("[conformance] mkdtemp failed");
  const std::string in_path = std::string(tmp) + "/in.jsonl", out_path = std::string(tmp) + "/out.jsonl";
  std::vector<size_t> slot(inputs.size());
  size_t unique = 0;
  {
    std::unordered_map<std::string, size_t> seen;
    std::ofstream out(in_path, std::ios::binary);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& x = inputs[i];
      std::string line = (x.b ? json::array({x.a, *x.b}) : json::array({x.a})).dump();
      auto [it, fresh] = seen.emplace(line, unique);
      slot[i] = it->second;
      if (fresh) {
        out << line << '\n';
        ++unique;
      }
    }
  }
  const std::string cmd = python + " " + MT_SOURCE_DIR + "/tests/python/hf_encode.py " + args + " < " + in_path + " > " +
                          out_path;
  const int rc = std::system(cmd.c_str());
  std::vector<Result> results;
  std::ifstream in(out_path, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    Result r;
    if (j.contains("error")) {
      r.error = true;
    } else {
      r.ids = j.at("ids").get<std::vector<int32_t>>();
      r.type_ids = j.at("type_ids").get<std::vector<int32_t>>();
      if (j.contains("attention_mask")) {
        r.mask = j.at("attention_mask").get<std::vector<int32_t>>();
        r.has_mask = true;
      }
      if (j.contains("decoded")) {
        r.decoded = j.at("decoded").get<std::string>();
        r.has_decoded = true;
      }
    }
    results.push_back(std::move(r));
  }
  fs::remove_all(tmp);
  if (rc != 0 || results.size() != unique)
    throw Error("[conformance] oracle failed (exit " + std::to_string(rc) + ", " + std::to_string(results.size()) +
                " results for " + std::to_string(unique) + " distinct inputs): " + cmd);
  std::vector<Result> all(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) all[i] = results[slot[i]];
  return all;
}

std::string ids_str(const std::vector<int32_t>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size() && i < 40; ++i) os << (i ? " " : "") << v[i];
  if (v.size() > 40) os << " ... (" << v.size() << ")";
  return os.str();
}

void compare(const std::string& label, const Tokenizer& tok, const std::vector<TextInput>& inputs,
             const std::vector<Result>& expected, bool batch, bool add_special, bool odd_split) {
  ASSERT_EQ(expected.size(), inputs.size());
  std::vector<Result> ours(inputs.size());
  auto fill = [&](Result& r, const Encoding& e, bool decode) {
    r.ids = e.ids;
    r.type_ids = e.type_ids;
    r.mask = e.attention_mask;
    if (decode) r.decoded = tok.decode(e.ids, true);
  };
  // Tokens of type 0 and 1 among the real (non-pad) tokens.
  auto split_sizes = [](const Result& r) {
    std::pair<size_t, size_t> n{0, 0};
    for (size_t k = 0; k < r.ids.size(); ++k)
      if (r.mask.empty() || r.mask[k]) (r.type_ids[k] ? n.second : n.first)++;
    return n;
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (batch) {  // one encode_batch call over inputs that are all pairs or all singles
    std::vector<Encoding> encs;
    if (inputs.front().b) {
      std::vector<std::pair<std::string, std::string>> pairs;
      for (const auto& x : inputs) pairs.emplace_back(x.a, x.b.value_or(""));
      encs = tok.encode_batch(pairs, add_special);
    } else {
      std::vector<std::string> texts;
      for (const auto& x : inputs) texts.push_back(x.a);
      encs = tok.encode_batch(texts, add_special);
    }
    for (size_t i = 0; i < inputs.size(); ++i) fill(ours[i], encs[i], expected[i].has_decoded);
  } else {
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < int64_t(inputs.size()); ++i) {
      const auto& x = inputs[size_t(i)];
      try {
        fill(ours[size_t(i)], x.b ? tok.encode_pair(x.a, *x.b, add_special) : tok.encode(x.a, add_special),
             expected[size_t(i)].has_decoded);
      } catch (const Error&) {
        ours[size_t(i)].error = true;
      }
    }
  }
  const double secs = seconds_since(t0);
  size_t same_ids = 0, same_all = 0, decoded = 0, same_decoded = 0, errors = 0, shown = 0, odd = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Result &e = expected[i], &o = ours[i];
    errors += e.error;
    const bool ids_ok = e.error == o.error && e.ids == o.ids;
    const bool all_ok = ids_ok && e.type_ids == o.type_ids && (!e.has_mask || e.mask == o.mask);
    same_ids += ids_ok;
    same_all += all_ok;
    if (e.has_decoded && !e.error) {
      ++decoded;
      same_decoded += e.decoded == o.decoded;
    }
    const bool decode_ok = !e.has_decoded || e.error || e.decoded == o.decoded;
    if (odd_split && !all_ok && !e.error && !o.error && e.ids.size() == o.ids.size()) {
      // Same length, and the first sequence has exactly one token more or less.
      const auto se = split_sizes(e), so = split_sizes(o);
      if (se.first + se.second == so.first + so.second && (se.first == so.first + 1 || so.first == se.first + 1)) {
        ++odd;
        continue;
      }
    }
    if ((!all_ok || !decode_ok) && shown++ < 3) {
      std::cout << "  MISMATCH " << label << " input " << i << ": a=" << json(inputs[i].a).dump()
                << (inputs[i].b ? " b=" + json(*inputs[i].b).dump() : "") << "\n    hf : "
                << (e.error ? "error" : ids_str(e.ids)) << " | types " << ids_str(e.type_ids) << " | "
                << json(e.decoded).dump() << "\n    ours: " << (o.error ? "error" : ids_str(o.ids)) << " | types "
                << ids_str(o.type_ids) << " | " << json(o.decoded).dump() << "\n";
    }
  }
  std::cout << "[conformance] " << label << ": ids identical " << same_ids << "/" << inputs.size()
            << ", ids+type ids+mask identical " << same_all << "/" << inputs.size();
  if (decoded) std::cout << ", decode identical " << same_decoded << "/" << decoded;
  if (errors) std::cout << ", " << errors << " inputs rejected by both";
  if (odd_split) std::cout << ", " << odd << " differ only in which sequence keeps the odd token";
  std::cout << " (ours " << secs << " s)\n";
  EXPECT_EQ(same_ids + odd, inputs.size()) << label;
  EXPECT_EQ(same_all + odd, inputs.size()) << label;
  EXPECT_EQ(same_decoded, decoded) << label;
}


std::vector<TextInput> edge_cases() {
  std::vector<std::string> s = {
      "",
      " ",
      "   leading and trailing   ",
      "Hello, World! HeLLo wOrLd.",
      "héllo naïve café Ångström über Straße ÉCOLE",
      "İstanbul ΣΊΣΥΦΟΣ ǅemal",
      "中文字符 and 日本語のテキスト 한국어 텍스트",
      "emoji 🤗🥰👍🏽 and ❤️ symbols ™ © ½ ² ∑",
      "tabs\tand\nnewlines\r\nand\vvertical\fformfeed",
      "nbsp\u00a0thin\u2009ideographic\u3000space\u200bzero-width",
      "control\x01\x02\x7f chars and \xc2\x85 next-line",
      "bom\xef\xbb\xbf inside and soft\xc2\xadhyphen",
      "combining: a\xcc\x81 e\xcc\x80\xcc\x81 o\xcc\x88\xcc\xb1 q\xcc\x95\xcc\x80",
      "numbers 3.14159 1,000,000 ٣٤٥ ①②③ Ⅻ",
      "contractions: it's I'm you're we've they'll he'd don't IT'S 'S ''s",
      "[CLS] literal [SEP] tokens [MASK] and [UNK] [PAD][SEP]x[sep]",
      "<|endoftext|>starts and ends<|endoftext|> a<|endoftext|>b <|endoftext|> ",
      std::string(150, 'a') + " long word " + std::string(101, 'b') + " " + std::string(100, 'c'),
      "supercalifragilisticexpialidocious antidisestablishmentarianism",
      "multiple     spaces  and \n\n\n blank   \t lines",
      "trailing spaces then newline   \n",
      "punctuation!!! ??? ... --- (parens) [brackets] {braces} <angles> @#$%^&*_+=|\\~`",
      "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ and ﬁ ligature",
      "Ελληνικά Русский текст עִבְרִית العربية हिन्दी ไทย",
      "private use \xee\x80\x80 and unassigned \xcd\xb8 and surrogate-free",
      "Mr. O'Neil's dog—a \"quick\" fox—jumped… 'twas 50% off $9.99!",
  };
  std::vector<TextInput> out;
  for (const auto& x : s) out.push_back({x, std::nullopt});
  for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back({s[i], s[i + 1]});
  return out;
}

}  // namespace mt::test
