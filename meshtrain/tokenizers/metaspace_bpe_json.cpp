// metaspace_bpe_from_json: the normalizer, pre-tokenizer, model and decoder keys of a
// LLaMA-family tokenizer.json.
#include "meshtrain/tokenizers/json_reader.h"
#include "meshtrain/tokenizers/metaspace_bpe.h"
#include "meshtrain/tokenizers/unicode.h"

namespace mt::tokenizers {
namespace {

using json = nlohmann::json;

// A Replace step's pattern: {"String": s}; regular expressions are refused.
std::string string_pattern(const Reader& r, const json& step, const std::string& where) {
  const json& p = r.at(step, "pattern", where);
  if (p.is_object() && p.contains("String")) return r.as<std::string>(p.at("String"), where + "pattern.String");
  if (p.is_object() && p.contains("Regex")) r.fail(detail::concat("'", where, "pattern' is a Regex: not supported (String only)"));
  r.fail(detail::concat("key '", where, "pattern' should be {\"String\": ...}"));
}

// A sequence's members, or the object itself when it is not a Sequence.
std::vector<std::pair<json, std::string>> steps_of(const Reader& r, const json& obj, const char* name, const char* list) {
  std::vector<std::pair<json, std::string>> steps;
  if (obj.is_null()) return steps;
  const std::string where = std::string(name) + ".";
  if (r.type_of(obj, where) != "Sequence") {
    steps.emplace_back(obj, where);
    return steps;
  }
  const json& items = r.at(obj, list, where);
  if (!items.is_array()) r.fail(detail::concat("key '", where, list, "' should be an array"));
  for (size_t i = 0; i < items.size(); ++i) steps.emplace_back(items[i], detail::concat(where, list, "[", i, "]."));
  return steps;
}

PrependScheme prepend_scheme(const Reader& r, const json& obj, const std::string& where) {
  if (obj.contains("prepend_scheme") && !obj.at("prepend_scheme").is_null()) {
    const auto s = r.as<std::string>(obj.at("prepend_scheme"), where + "prepend_scheme");
    if (s == "always") return PrependScheme::always;
    if (s == "first") return PrependScheme::first;
    if (s == "never") return PrependScheme::never;
    r.fail(detail::concat("key '", where, "prepend_scheme' is '", s, "' (expected always, first or never)"));
  }
  // Files older than prepend_scheme say add_prefix_space.
  return r.get<bool>(obj, "add_prefix_space", where, true) ? PrependScheme::always : PrependScheme::never;
}

std::vector<NormalizeStep> read_normalizer(const Reader& r, const json& normalizer) {
  std::vector<NormalizeStep> out;
  for (const auto& [step, where] : steps_of(r, normalizer, "normalizer", "normalizers")) {
    const std::string type = r.type_of(step, where);
    NormalizeStep s;
    if (type == "Prepend") {
      s.prepend = true;
      s.content = r.as<std::string>(r.at(step, "prepend", where), where + "prepend");
    } else if (type == "Replace") {
      s.pattern = string_pattern(r, step, where);
      s.content = r.as<std::string>(r.at(step, "content", where), where + "content");
    } else {
      r.fail(detail::concat("unsupported normalizer type '", type, "' at '", where,
                            "' for BPE (supported: Prepend, Replace, a Sequence of them)"));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<MetaspaceOptions> read_pre_tokenizer(const Reader& r, const json& pre) {
  std::optional<MetaspaceOptions> out;
  for (const auto& [step, where] : steps_of(r, pre, "pre_tokenizer", "pretokenizers")) {
    const std::string type = r.type_of(step, where);
    if (type != "Metaspace" || out)
      r.fail(detail::concat("unsupported pre_tokenizer '", type, "' at '", where,
                            "' for BPE (supported: ByteLevel, one Metaspace, or none)"));
    MetaspaceOptions m;
    m.replacement = r.get<std::string>(step, "replacement", where, m.replacement);
    m.prepend_scheme = prepend_scheme(r, step, where);
    m.split = r.get<bool>(step, "split", where, true);
    out = m;
  }
  return out;
}

DecoderChain read_decoder(const Reader& r, const json& decoder) {
  std::vector<DecodeStep> out;
  for (const auto& [step, where] : steps_of(r, decoder, "decoder", "decoders")) {
    const std::string type = r.type_of(step, where);
    if (type == "Replace") {
      out.push_back(DecodeStep::replace_with(string_pattern(r, step, where),
                                             r.as<std::string>(r.at(step, "content", where), where + "content")));
    } else if (type == "ByteFallback") {
      out.push_back(DecodeStep::byte_fallback_step());
    } else if (type == "Fuse") {
      out.push_back(DecodeStep::fuse_step());
    } else if (type == "Strip") {
      const auto content = r.as<std::string>(r.at(step, "content", where), where + "content");
      if (unicode::char_count(content) != 1) r.fail(detail::concat("key '", where, "content' must be one character"));
      uint32_t cp;
      unicode::decode_utf8(content, 0, cp);
      out.push_back(DecodeStep::strip_step(cp, r.get<size_t>(step, "start", where, 0), r.get<size_t>(step, "stop", where, 0)));
    } else if (type == "Metaspace") {
      out.push_back(DecodeStep::metaspace_step(r.get<std::string>(step, "replacement", where, "\xE2\x96\x81"),
                                               prepend_scheme(r, step, where) != PrependScheme::never));
    } else {
      r.fail(detail::concat("unsupported decoder type '", type, "' at '", where,
                            "' for BPE (supported: ByteLevel, or Replace, ByteFallback, Fuse, Strip, Metaspace)"));
    }
  }
  return DecoderChain(std::move(out));
}

}  // namespace

std::shared_ptr<MetaspaceBpeTokenizer> metaspace_bpe_from_json(const std::string& path, const json& model,
                                                               const json& normalizer, const json& pre_tokenizer,
                                                               const json& decoder, Vocab vocab,
                                                               const std::vector<BpeMerge>& merges) {
  const Reader r{path};
  MetaspaceBpeOptions o;
  o.source = path;
  o.normalizer = read_normalizer(r, normalizer);
  o.metaspace = read_pre_tokenizer(r, pre_tokenizer);
  o.decoder = read_decoder(r, decoder);
  if (model.contains("unk_token") && !model.at("unk_token").is_null())
    o.unk_token = r.as<std::string>(model.at("unk_token"), "model.unk_token");
  o.byte_fallback = r.get<bool>(model, "byte_fallback", "model.", false);
  o.fuse_unk = r.get<bool>(model, "fuse_unk", "model.", false);
  o.ignore_merges = r.get<bool>(model, "ignore_merges", "model.", false);
  try {
    return std::make_shared<MetaspaceBpeTokenizer>(std::move(vocab), merges, std::move(o));
  } catch (const Error& e) {
    r.fail(e.what());
  }
}

}  // namespace mt::tokenizers
