#include "meshtrain/posttrain/rewards.h"

#include <unistd.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"

namespace mt::posttrain {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string first_line(const std::string& s) {
  const std::string t = trim(s);
  return trim(t.substr(0, t.find('\n')));
}

// The last number in a text ("... so 1,234.5" -> 1234.5), thousands separators dropped.
std::optional<double> last_number(const std::string& text) {
  static const std::regex number(R"(-?\d[\d,]*(\.\d+)?)");
  std::optional<double> last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator(); ++it) {
    std::string digits;
    for (char c : it->str())
      if (c != ',') digits += c;
    last = std::strtod(digits.c_str(), nullptr);
  }
  return last;
}

}  // namespace

std::string field_text(const data::Example& e, const std::string& name) {
  const data::Value& v = e.at(name);
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return data::describe(*d);
  return data::describe(v);
}

RewardFunction exact_match_reward(const std::string& field) {
  return {"exact_match", [field](const std::vector<RewardInput>& in) {
            std::vector<double> r;
            for (const RewardInput& x : in) r.push_back(first_line(x.completion) == trim(field_text(*x.example, field)) ? 1.0 : 0.0);
            return r;
          }};
}

RewardFunction numeric_reward(const std::string& field) {
  return {"numeric", [field](const std::vector<RewardInput>& in) {
            std::vector<double> r;
            for (const RewardInput& x : in) {
              const std::optional<double> got = last_number(x.completion), want = last_number(field_text(*x.example, field));
              r.push_back(got && want && std::abs(*got - *want) <= 1e-9 * std::max(1.0, std::abs(*want)) ? 1.0 : 0.0);
            }
            return r;
          }};
}

RewardFunction format_reward(const std::string& pattern) {
  std::shared_ptr<const std::regex> re;
  try {
    re = std::make_shared<const std::regex>(pattern);
  } catch (const std::regex_error& e) {
    throw Error(detail::concat("[grpo] format:", pattern, " is not a valid regex: ", e.what()));
  }
  return {"format", [re](const std::vector<RewardInput>& in) {
            std::vector<double> r;
            for (const RewardInput& x : in) r.push_back(std::regex_match(x.completion, *re) ? 1.0 : 0.0);
            return r;
          }};
}

RewardFunction command_reward(const std::string& command) {
  return {"command", [command](const std::vector<RewardInput>& in) {
            namespace fs = std::filesystem;
            const std::string stem = (fs::temp_directory_path() / ("mt_reward_" + std::to_string(getpid()))).string();
            const std::string input = stem + ".jsonl", errors = stem + ".err";
            {
              std::ofstream out(input);
              for (const RewardInput& x : in) {
                nlohmann::json row = nlohmann::json::object();
                if (x.example)
                  for (const auto& [k, v] : *x.example) {
                    if (const auto* s = std::get_if<std::string>(&v)) row[k] = *s;
                    else if (const auto* i = std::get_if<int64_t>(&v)) row[k] = *i;
                    else if (const auto* d = std::get_if<double>(&v)) row[k] = *d;
                    else row[k] = std::get<std::vector<int64_t>>(v);
                  }
                row["prompt"] = x.prompt;
                row["completion"] = x.completion;
                out << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
              }
            }
            FILE* p = popen(("(" + command + ") < " + input + " 2> " + errors).c_str(), "r");
            MT_CHECK(p != nullptr, "[grpo] cannot run the reward command '", command, "'");
            std::string text;
            char buf[4096];
            for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
            const int status = pclose(p);
            std::ifstream err_in(errors);
            const std::string err((std::istreambuf_iterator<char>(err_in)), {});
            fs::remove(input);
            fs::remove(errors);
            MT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "[grpo] the reward command '", command, "' ",
                     WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status)) : std::string("was killed"),
                     err.empty() ? std::string() : "; its stderr:\n" + err);
            std::vector<double> r;
            size_t line_no = 0;
            std::istringstream lines(text);
            for (std::string line; std::getline(lines, line);) {
              ++line_no;
              if (trim(line).empty()) continue;
              char* end = nullptr;
              const std::string t = trim(line);
              const double v = std::strtod(t.c_str(), &end);
              MT_CHECK(end == t.c_str() + t.size() && std::isfinite(v), "[grpo] the reward command '", command,
                       "' printed '", t.substr(0, 60), "' on line ", line_no, ": not a number");
              r.push_back(v);
            }
            MT_CHECK(r.size() == in.size(), "[grpo] the reward command '", command, "' printed ", r.size(), " numbers for ",
                     in.size(), " completions (one per line expected)");
            return r;
          }};
}

std::vector<RewardFunction> parse_rewards(const std::string& spec) {
  MT_CHECK(!trim(spec).empty(), "[grpo] no reward named (exact_match:FIELD, numeric:FIELD, format:REGEX)");
  static const std::vector<std::string> kinds{"exact_match:", "numeric:", "format:"};
  std::vector<std::string> items;
  size_t start = 0;
  for (size_t i = 0; i <= spec.size(); ++i) {
    bool cut = i == spec.size();
    if (!cut && spec[i] == ',')
      for (const std::string& k : kinds) cut = cut || spec.compare(i + 1, k.size(), k) == 0;
    if (cut) {
      items.push_back(spec.substr(start, i - start));
      start = i + 1;
    }
  }
  std::vector<RewardFunction> out;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string kind = item.substr(0, colon), arg = colon == std::string::npos ? "" : item.substr(colon + 1);
    MT_CHECK(colon != std::string::npos && !arg.empty(), "[grpo] reward '", item,
             "' needs its argument (exact_match:FIELD, numeric:FIELD, format:REGEX)");
    if (kind == "exact_match") out.push_back(exact_match_reward(arg));
    else if (kind == "numeric") out.push_back(numeric_reward(arg));
    else if (kind == "format") out.push_back(format_reward(arg));
    else throw Error("[grpo] unknown reward '" + kind + "' (exact_match:FIELD, numeric:FIELD, format:REGEX)");
  }
  return out;
}

std::vector<std::string> reward_fields(const std::string& spec) {
  std::vector<std::string> fields;
  for (const std::string& k : {std::string("exact_match:"), std::string("numeric:")})
    for (size_t at = spec.find(k); at != std::string::npos; at = spec.find(k, at + 1)) {
      if (at > 0 && spec[at - 1] != ',') continue;
      const size_t end = spec.find(',', at);
      fields.push_back(spec.substr(at + k.size(), end == std::string::npos ? std::string::npos : end - at - k.size()));
    }
  return fields;
}

}  // namespace mt::posttrain
