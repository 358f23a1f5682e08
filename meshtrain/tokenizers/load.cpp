// load_tokenizer: tokenizer.json (Hugging Face's serialized pipeline), vocab.txt,
// vocab.json/encoder.json + merges, SentencePiece .model, or a directory of those.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/tokenizers/bpe.h"
#include "meshtrain/tokenizers/json_reader.h"
#include "meshtrain/tokenizers/metaspace_bpe.h"
#include "meshtrain/tokenizers/sentencepiece.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/tokenizers/wordpiece.h"

namespace mt::tokenizers {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[tokenizer] cannot open '", path, "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(detail::concat("[tokenizer] ", path, ": bad JSON: ", e.what()));
  }
}

Vocab read_vocab_object(const Reader& r, const json& v, const std::string& name) {
  if (!v.is_object()) r.fail(detail::concat("key '", name, "' should be an object mapping tokens to ids"));
  Vocab vocab;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (1ll << 31))
      r.fail(detail::concat("token '", it.key(), "' in '", name, "' has id ", it.value().dump(),
                            " (expected an integer >= 0)"));
    vocab.add(it.key(), it.value().get<int32_t>());
  }
  if (vocab.size() == 0) r.fail(detail::concat("'", name, "' is empty"));
  return vocab;
}

std::vector<BpeMerge> read_merges_array(const Reader& r, const json& v) {
  if (!v.is_array()) r.fail("key 'model.merges' should be an array");
  std::vector<BpeMerge> merges;
  merges.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    if (m.is_string()) {  // older files: "a b"
      const auto s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
        r.fail(detail::concat("model.merges[", i, "] = '", s, "' is not two space-separated tokens"));
      merges.push_back({s.substr(0, sp), s.substr(sp + 1), 0});
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // newer: ["a", "b"]
      merges.push_back({m[0].get<std::string>(), m[1].get<std::string>(), 0});
    } else {
      r.fail(detail::concat("model.merges[", i, "] = ", m.dump(), " is not a merge (\"a b\" or [\"a\", \"b\"])"));
    }
  }
  return merges;
}

// Model type, inferred from the keys when "type" is absent (older files leave it out).
std::string model_type(const Reader& r, const json& model) {
  if (!model.is_object()) r.fail("key 'model' should be an object");
  if (model.contains("type")) return r.type_of(model, "model.");
  if (model.contains("merges")) return "BPE";
  if (model.contains("continuing_subword_prefix") || model.contains("max_input_chars_per_word")) return "WordPiece";
  if (model.contains("vocab") && model.at("vocab").is_array()) return "Unigram";
  if (model.contains("unk_token") && model.contains("vocab")) return "WordLevel";
  r.fail("cannot tell the model type: 'model' has no 'type' key and no recognizable fields");
}

// A post-processor json (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel,
// Sequence, null) as a template (ByteLevel and null add no tokens).
TemplateProcessing read_post_processor(const Reader& r, const json& pp) {
  if (pp.is_null()) return TemplateProcessing();
  const std::string type = r.type_of(pp, "post_processor.");
  if (type == "ByteLevel") return TemplateProcessing();  // only adjusts offsets
  if (type == "Sequence") {
    const json& procs = r.at(pp, "processors", "post_processor.");
    if (!procs.is_array()) r.fail("key 'post_processor.processors' should be an array");
    std::optional<TemplateProcessing> found;
    for (const auto& p : procs) {
      const std::string t = r.type_of(p, "post_processor.processors[].");
      if (t == "ByteLevel") continue;
      if (found) r.fail("post_processor Sequence with more than one token-adding processor is not supported");
      found = read_post_processor(r, p);
    }
    return found.value_or(TemplateProcessing());
  }
  auto pair_of = [&](const char* key) {
    const json& v = r.at(pp, key, "post_processor.");
    if (!v.is_array() || v.size() != 2 || !v[0].is_string() || !v[1].is_number_integer())
      r.fail(detail::concat("key 'post_processor.", key, "' should be [token, id]"));
    return std::pair<std::string, int32_t>{v[0].get<std::string>(), v[1].get<int32_t>()};
  };
  using Piece = TemplateProcessing::Piece;
  if (type == "BertProcessing") {
    const auto [sep, sep_id] = pair_of("sep");
    const auto [cls, cls_id] = pair_of("cls");
    return TemplateProcessing::bert(cls, cls_id, sep, sep_id);
  }
  if (type == "RobertaProcessing") {
    // <s> A </s> and <s> A </s></s> B </s>, all type id 0 (RoBERTa has one segment type).
    const auto [sep, sep_id] = pair_of("sep");
    const auto [cls, cls_id] = pair_of("cls");
    std::vector<std::pair<std::string, TemplateProcessing::SpecialToken>> sp{{cls, {{cls_id}, {cls}}},
                                                                              {sep, {{sep_id}, {sep}}}};
    return TemplateProcessing({{false, 0, cls, 0}, {true, 0, "", 0}, {false, 0, sep, 0}},
                              {{false, 0, cls, 0}, {true, 0, "", 0}, {false, 0, sep, 0}, {false, 0, sep, 0},
                               {true, 1, "", 0}, {false, 0, sep, 0}},
                              std::move(sp));
  }
  if (type == "TemplateProcessing") {
    auto pieces = [&](const char* key) {
      const json& v = r.at(pp, key, "post_processor.");
      if (!v.is_array()) r.fail(detail::concat("key 'post_processor.", key, "' should be an array"));
      std::vector<Piece> out;
      for (const auto& item : v) {
        Piece p;
        if (item.contains("SpecialToken")) {
          const json& s = item.at("SpecialToken");
          p.special = r.as<std::string>(r.at(s, "id", "post_processor.SpecialToken."), "post_processor.SpecialToken.id");
          p.type_id = r.get<int32_t>(s, "type_id", "post_processor.SpecialToken.", 0);
        } else if (item.contains("Sequence")) {
          const json& s = item.at("Sequence");
          const auto id = r.as<std::string>(r.at(s, "id", "post_processor.Sequence."), "post_processor.Sequence.id");
          if (id != "A" && id != "B") r.fail(detail::concat("post_processor sequence id '", id, "' (expected A or B)"));
          p.is_sequence = true;
          p.sequence = id == "A" ? 0 : 1;
          p.type_id = r.get<int32_t>(s, "type_id", "post_processor.Sequence.", 0);
        } else {
          r.fail(detail::concat("post_processor.", key, " item ", item.dump(), " is neither SpecialToken nor Sequence"));
        }
        out.push_back(std::move(p));
      }
      return out;
    };
    std::vector<std::pair<std::string, TemplateProcessing::SpecialToken>> specials;
    const json& st = r.at(pp, "special_tokens", "post_processor.");
    if (!st.is_object()) r.fail("key 'post_processor.special_tokens' should be an object");
    for (auto it = st.begin(); it != st.end(); ++it) {
      TemplateProcessing::SpecialToken t;
      t.ids = r.as<std::vector<int32_t>>(r.at(it.value(), "ids", "post_processor.special_tokens." + it.key() + "."),
                                         "post_processor.special_tokens." + it.key() + ".ids");
      t.tokens = r.as<std::vector<std::string>>(
          r.at(it.value(), "tokens", "post_processor.special_tokens." + it.key() + "."),
          "post_processor.special_tokens." + it.key() + ".tokens");
      specials.emplace_back(it.key(), std::move(t));
    }
    try {
      return TemplateProcessing(pieces("single"), pieces("pair"), std::move(specials));
    } catch (const Error& e) {
      r.fail(e.what());
    }
  }
  r.fail(detail::concat("unsupported post_processor type '", type,
                        "' (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)"));
}

std::shared_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const json& root) {
  const Reader r{path};
  if (!root.is_object()) r.fail("expected a JSON object at the top level");
  const json& model = r.at(root, "model", "");
  const std::string type = model_type(r, model);
  const json null_json;
  const json& normalizer = root.contains("normalizer") ? root.at("normalizer") : null_json;
  const json& pre = root.contains("pre_tokenizer") ? root.at("pre_tokenizer") : null_json;
  const json& decoder = root.contains("decoder") ? root.at("decoder") : null_json;

  std::shared_ptr<Tokenizer> tok;
  if (type == "WordPiece") {
    WordPieceOptions o;
    o.unk_token = r.get<std::string>(model, "unk_token", "model.", "[UNK]");
    o.continuing_subword_prefix = r.get<std::string>(model, "continuing_subword_prefix", "model.", "##");
    o.max_input_chars_per_word = r.get<size_t>(model, "max_input_chars_per_word", "model.", 100);
    if (normalizer.is_null()) {
      o.normalizer.reset();
    } else {
      const std::string nt = r.type_of(normalizer, "normalizer.");
      if (nt != "BertNormalizer")
        r.fail(detail::concat("unsupported normalizer type '", nt, "' for WordPiece (supported: BertNormalizer)"));
      o.normalizer->clean_text = r.get<bool>(normalizer, "clean_text", "normalizer.", true);
      o.normalizer->handle_chinese_chars = r.get<bool>(normalizer, "handle_chinese_chars", "normalizer.", true);
      o.normalizer->lowercase = r.get<bool>(normalizer, "lowercase", "normalizer.", true);
      if (normalizer.contains("strip_accents") && !normalizer.at("strip_accents").is_null())
        o.normalizer->strip_accents = r.as<bool>(normalizer.at("strip_accents"), "normalizer.strip_accents");
    }
    if (pre.is_null() || r.type_of(pre, "pre_tokenizer.") != "BertPreTokenizer")
      r.fail(detail::concat("unsupported pre_tokenizer ", pre.is_null() ? "null" : "'" + r.type_of(pre, "pre_tokenizer.") + "'",
                            " for WordPiece (supported: BertPreTokenizer)"));
    if (decoder.is_null()) {
      o.decoder = false;
    } else {
      const std::string dt = r.type_of(decoder, "decoder.");
      if (dt != "WordPiece") r.fail(detail::concat("unsupported decoder type '", dt, "' for WordPiece"));
      o.decoder_prefix = r.get<std::string>(decoder, "prefix", "decoder.", "##");
      o.decoder_cleanup = r.get<bool>(decoder, "cleanup", "decoder.", true);
    }
    try {
      tok = std::make_shared<WordPieceTokenizer>(read_vocab_object(r, r.at(model, "vocab", "model."), "model.vocab"), o);
    } catch (const Error& e) {
      r.fail(e.what());
    }
  } else if (type == "BPE") {
    if (!r.get<std::string>(model, "continuing_subword_prefix", "model.", "").empty() ||
        !r.get<std::string>(model, "end_of_word_suffix", "model.", "").empty())
      r.fail("BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
    if (model.contains("dropout") && !model.at("dropout").is_null())
      r.fail("BPE dropout is not supported (deterministic encoding only)");
    Vocab vocab = read_vocab_object(r, r.at(model, "vocab", "model."), "model.vocab");
    const auto merges = read_merges_array(r, r.at(model, "merges", "model."));
    const bool byte_level = !pre.is_null() && r.type_of(pre, "pre_tokenizer.") == "ByteLevel";
    if (byte_level) {  // GPT-2, RoBERTa
      BpeOptions o;
      o.source = path;
      if (!normalizer.is_null())
        r.fail(detail::concat("unsupported normalizer type '", r.type_of(normalizer, "normalizer."),
                              "' for byte-level BPE (it takes none)"));
      o.add_prefix_space = r.get<bool>(pre, "add_prefix_space", "pre_tokenizer.", true);
      o.use_regex = r.get<bool>(pre, "use_regex", "pre_tokenizer.", true);
      if (r.get<bool>(model, "byte_fallback", "model.", false)) r.fail("byte_fallback with a ByteLevel pre_tokenizer is not supported");
      if (decoder.is_null()) {
        o.decoder = false;
      } else {
        const std::string dt = r.type_of(decoder, "decoder.");
        if (dt != "ByteLevel") r.fail(detail::concat("unsupported decoder type '", dt, "' for byte-level BPE"));
      }
      tok = std::make_shared<ByteLevelBpeTokenizer>(std::move(vocab), merges, o);
    } else {  // LLaMA, Mistral: SentencePiece-style text with byte fallback
      tok = metaspace_bpe_from_json(path, model, normalizer, pre, decoder, std::move(vocab), merges);
    }
  } else if (type == "Unigram" || type == "WordLevel") {
    r.fail(detail::concat("model type '", type, "' is not supported (supported: WordPiece, BPE; use a .model file for SentencePiece)"));
  } else {
    r.fail(detail::concat("unknown model type '", type, "' (supported: WordPiece, BPE)"));
  }

  if (root.contains("added_tokens") && !root.at("added_tokens").is_null()) {
    const json& added = root.at("added_tokens");
    if (!added.is_array()) r.fail("key 'added_tokens' should be an array");
    std::vector<AddedToken> tokens;
    for (size_t i = 0; i < added.size(); ++i) {
      const std::string where = detail::concat("added_tokens[", i, "].");
      AddedToken t;
      t.id = r.as<int32_t>(r.at(added[i], "id", where), where + "id");
      t.content = r.as<std::string>(r.at(added[i], "content", where), where + "content");
      t.special = r.get<bool>(added[i], "special", where, false);
      t.normalized = r.get<bool>(added[i], "normalized", where, !t.special);
      t.lstrip = r.get<bool>(added[i], "lstrip", where, false);
      t.rstrip = r.get<bool>(added[i], "rstrip", where, false);
      t.single_word = r.get<bool>(added[i], "single_word", where, false);
      if (t.content.empty()) r.fail(detail::concat(where, "content is empty"));
      tokens.push_back(std::move(t));
    }
    tok->add_tokens(std::move(tokens));
  }
  tok->set_post_processor(read_post_processor(r, root.contains("post_processor") ? root.at("post_processor") : null_json));

  if (root.contains("truncation") && !root.at("truncation").is_null()) {
    const json& t = root.at("truncation");
    TruncationParams p;
    p.max_length = r.as<size_t>(r.at(t, "max_length", "truncation."), "truncation.max_length");
    p.strategy = parse_truncation_strategy(r.get<std::string>(t, "strategy", "truncation.", "LongestFirst"));
    p.direction = r.get<std::string>(t, "direction", "truncation.", "Right") == "Left" ? Side::left : Side::right;
    if (r.get<size_t>(t, "stride", "truncation.", 0) != 0) r.fail("truncation stride > 0 is not supported");
    tok->set_truncation(p);
  }
  if (root.contains("padding") && !root.at("padding").is_null()) {
    const json& j = root.at("padding");
    PaddingParams p;
    const json& strategy = r.at(j, "strategy", "padding.");
    if (strategy.is_object() && strategy.contains("Fixed")) p.length = r.as<size_t>(strategy.at("Fixed"), "padding.strategy.Fixed");
    else if (!(strategy.is_string() && strategy.get<std::string>() == "BatchLongest"))
      r.fail(detail::concat("padding.strategy ", strategy.dump(), " (expected \"BatchLongest\" or {\"Fixed\": n})"));
    p.direction = r.get<std::string>(j, "direction", "padding.", "Right") == "Left" ? Side::left : Side::right;
    p.pad_to_multiple_of = r.get<size_t>(j, "pad_to_multiple_of", "padding.", 0);
    p.pad_id = r.get<int32_t>(j, "pad_id", "padding.", 0);
    p.pad_type_id = r.get<int32_t>(j, "pad_type_id", "padding.", 0);
    p.pad_token = r.get<std::string>(j, "pad_token", "padding.", "[PAD]");
    tok->set_padding(p);
  }
  return tok;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A vocab.json / encoder.json's merges file beside it.
std::string find_merges_for(const fs::path& vocab) {
  const fs::path dir = vocab.parent_path();
  std::string name = vocab.filename().string();
  std::vector<fs::path> candidates;
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"encoder.json", "vocab.bpe"}, {"vocab.json", "merges.txt"}})
    if (ends_with(name, from)) candidates.push_back(dir / (name.substr(0, name.size() - from.size()) + to));
  for (const char* name : {"merges.txt", "vocab.bpe"})
    if (std::find(candidates.begin(), candidates.end(), dir / name) == candidates.end()) candidates.push_back(dir / name);
  for (const auto& c : candidates)
    if (fs::is_regular_file(c)) return c.string();
  std::string names;
  for (size_t i = 0; i < candidates.size(); ++i)
    names += (i ? (i + 1 == candidates.size() ? " or " : ", ") : "") + candidates[i].filename().string();
  throw Error(detail::concat("[tokenizer] ", vocab.string(), " is a BPE vocabulary but no merges file (", names,
                             ") is beside it"));
}

std::optional<bool> config_lowercase(const fs::path& dir, std::optional<bool>& strip_accents, bool& chinese) {
  const fs::path cfg = dir / "tokenizer_config.json";
  if (!fs::is_regular_file(cfg)) return std::nullopt;
  const json j = read_json(cfg.string());
  const Reader r{cfg.string()};
  if (j.contains("strip_accents") && !j.at("strip_accents").is_null()) strip_accents = r.as<bool>(j.at("strip_accents"), "strip_accents");
  chinese = r.get<bool>(j, "tokenize_chinese_chars", "", true);
  if (j.contains("do_lower_case") && !j.at("do_lower_case").is_null()) return r.as<bool>(j.at("do_lower_case"), "do_lower_case");
  return std::nullopt;
}

// A SentencePiece model with T5Tokenizer's sentinel count from tokenizer_config.json's
// "extra_ids" beside it (100 when absent, as in every released T5 and mT5).
std::shared_ptr<Tokenizer> load_sentencepiece_model(const fs::path& model) {
  const fs::path cfg = model.parent_path() / "tokenizer_config.json";
  int64_t extra_ids = 100;
  if (fs::is_regular_file(cfg)) {
    const Reader r{cfg.string()};
    extra_ids = r.get<int64_t>(read_json(cfg.string()), "extra_ids", "", 100);
    if (extra_ids < 0) r.fail(detail::concat("extra_ids must be >= 0, got ", extra_ids));
  }
  return load_sentencepiece(model.string(), extra_ids);
}

}  // namespace

std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path, const LoadOptions& options) {
  const fs::path p(path);
  MT_CHECK(fs::exists(p), "[tokenizer] '", path, "' does not exist");
  if (fs::is_directory(p)) {
    if (fs::is_regular_file(p / "tokenizer.json")) {
      const std::string file = (p / "tokenizer.json").string();
      return load_tokenizer_json(file, read_json(file));
    }
    if (fs::is_regular_file(p / "vocab.txt")) {
      std::optional<bool> strip_accents;
      bool chinese = true;
      std::optional<bool> lower = options.lowercase;
      const auto cfg_lower = config_lowercase(p, strip_accents, chinese);
      if (!lower) lower = cfg_lower;
      return load_wordpiece_vocab((p / "vocab.txt").string(), lower, strip_accents, chinese);
    }
    if (fs::is_regular_file(p / "vocab.json") && fs::is_regular_file(p / "merges.txt"))
      return load_bpe_files((p / "vocab.json").string(), (p / "merges.txt").string());
    if (fs::is_regular_file(p / "encoder.json") && fs::is_regular_file(p / "vocab.bpe"))
      return load_bpe_files((p / "encoder.json").string(), (p / "vocab.bpe").string());
    for (const char* name : {"spiece.model", "tokenizer.model", "sentencepiece.bpe.model"})
      if (fs::is_regular_file(p / name)) return load_sentencepiece_model(p / name);
    throw Error(detail::concat("[tokenizer] directory '", path,
                               "' holds no tokenizer (looked for tokenizer.json, vocab.txt, vocab.json + merges.txt, "
                               "encoder.json + vocab.bpe, spiece.model, tokenizer.model)"));
  }
  const std::string name = p.filename().string();
  if (ends_with(name, ".model")) return load_sentencepiece_model(p);
  if (ends_with(name, ".json")) {
    // A tokenizer.json has "model"; a vocab.json/encoder.json is a flat token -> id object.
    const json root = read_json(path);
    // (A GPT-2 vocabulary has a token "model", so look at the value, not the key.)
    const bool has_model = root.is_object() && root.contains("model") && root.at("model").is_object();
    if (root.is_object() && !has_model && !root.empty() && root.begin()->is_number_integer())
      return load_bpe_files(path, find_merges_for(p));
    return load_tokenizer_json(path, root);
  }
  if (ends_with(name, ".bpe") || ends_with(name, "merges.txt")) {
    throw Error(detail::concat("[tokenizer] '", path,
                               "' is a BPE merges file: load its vocabulary (vocab.json / encoder.json) or the directory"));
  }
  if (ends_with(name, ".txt")) {
    std::optional<bool> strip_accents;
    bool chinese = true;
    std::optional<bool> lower = options.lowercase;
    const auto cfg_lower = config_lowercase(p.parent_path(), strip_accents, chinese);
    if (!lower) lower = cfg_lower;
    return load_wordpiece_vocab(path, lower, strip_accents, chinese);
  }
  throw Error(detail::concat("[tokenizer] '", path,
                             "': unknown tokenizer file type (expected tokenizer.json, vocab.txt, vocab.json, "
                             "encoder.json or a SentencePiece .model)"));
}

void copy_tokenizer_files(const std::string& path, const std::string& dir) {
  const fs::path src(path), dst(dir);
  MT_CHECK(fs::exists(src), "[tokenizer] '", path, "' does not exist");
  fs::create_directories(dst);
  auto copy = [&](const fs::path& from, const std::string& name) {
    if (fs::exists(dst / name) && fs::equivalent(from, dst / name)) return;  // already there
    fs::copy_file(from, dst / name, fs::copy_options::overwrite_existing);
  };
  if (fs::is_directory(src)) {
    int copied = 0;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                             "merges.txt", "encoder.json", "vocab.bpe", "spiece.model", "tokenizer.model",
                             "sentencepiece.bpe.model"})
      if (fs::is_regular_file(src / name)) {
        copy(src / name, name);
        ++copied;
      }
    MT_CHECK(copied > 0, "[tokenizer] directory '", path, "' holds no tokenizer files");
    return;
  }
  const std::string name = src.filename().string();
  if (ends_with(name, ".model")) return copy(src, "tokenizer.model");
  if (ends_with(name, ".txt")) {
    if (fs::is_regular_file(src.parent_path() / "tokenizer_config.json"))
      copy(src.parent_path() / "tokenizer_config.json", "tokenizer_config.json");
    return copy(src, "vocab.txt");
  }
  MT_CHECK(ends_with(name, ".json"), "[tokenizer] '", path, "': unknown tokenizer file type");
  const json root = read_json(path);
  const bool has_model = root.is_object() && root.contains("model") && root.at("model").is_object();
  if (has_model) return copy(src, "tokenizer.json");
  copy(src, "vocab.json");
  copy(find_merges_for(src), "merges.txt");
}

}  // namespace mt::tokenizers
