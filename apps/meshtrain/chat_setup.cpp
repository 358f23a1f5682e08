#include "apps/meshtrain/chat_setup.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/serve/chat_template/chat_template.h"

namespace mt::cli {

namespace {

// A special token's text from tokenizer_config.json: a string or {"content": ...}.
std::string special_token_content(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

void load_chat_template(serve::ServedModel& m, const std::string& model_path, const std::string& override_file,
                        const std::string& command) {
  namespace fs = std::filesystem;
  auto read = [&command](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    MT_CHECK(in, "[" + command + "] cannot read ", p.string());
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const fs::path dir = fs::is_directory(model_path) ? fs::path(model_path) : fs::path();
  std::string source;
  if (!dir.empty() && fs::exists(dir / "tokenizer_config.json")) {
    const std::string file = (dir / "tokenizer_config.json").string();
    nlohmann::json cfg = nlohmann::json::parse(read(file), nullptr, false);
    MT_CHECK(!cfg.is_discarded() && cfg.is_object(), "[" + command + "] ", file, " is not a JSON object");
    m.bos_token = special_token_content(cfg.value("bos_token", nlohmann::json()));
    m.eos_token = special_token_content(cfg.value("eos_token", nlohmann::json()));
    const nlohmann::json t = cfg.value("chat_template", nlohmann::json());
    if (t.is_string()) source = t.get<std::string>();
    if (t.is_array())
      for (const auto& named : t)
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template"))
          source = named["template"].get<std::string>();
  }
  if (!dir.empty() && fs::exists(dir / "chat_template.jinja")) source = read(dir / "chat_template.jinja");
  if (!override_file.empty()) source = read(override_file);
  if (source.empty()) return;
  try {
    m.chat_template = std::make_shared<serve::ChatTemplate>(source);
  } catch (const Error& e) {
    MT_CHECK(false, "[" + command + "] the chat template of ", override_file.empty() ? model_path : override_file,
             " does not parse: ", e.what());
  }
}

}  // namespace mt::cli
