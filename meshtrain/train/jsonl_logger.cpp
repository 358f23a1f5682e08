#include "meshtrain/train/jsonl_logger.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "meshtrain/core/error.h"

namespace mt::train {

namespace {

// The complete lines of an existing log that a resumed run keeps.
std::vector<std::string> kept_lines(const std::string& path, std::optional<int64_t> resume_step, bool* changed) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::vector<std::string> lines;
  size_t start = 0, line_no = 0;
  *changed = false;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {  // partial last line from a killed writer
      *changed = true;
      break;
    }
    std::string line = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    if (resume_step) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      MT_CHECK(!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer(),
               "[JsonlLogger] ", path, ":", line_no, ": not a metrics line with an integer \"step\": ", line);
      if (j["step"].get<int64_t>() > *resume_step) {
        *changed = true;
        continue;
      }
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace

JsonlLogger::JsonlLogger(const std::string& path, JsonlLoggerOptions options) : path_(path) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    MT_CHECK(!ec, "[JsonlLogger] cannot create directory '", p.parent_path().string(), "': ", ec.message());
  }
  if (options.append && std::filesystem::exists(p)) {
    bool changed = false;
    std::vector<std::string> lines = kept_lines(path, options.resume_step, &changed);
    if (changed) {
      // Rewrite through a temp file so a crash here never loses the kept lines.
      std::string tmp = path + ".tmp";
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        for (const auto& l : lines) out << l << '\n';
        MT_CHECK(out.good(), "[JsonlLogger] cannot write '", tmp, "'");
      }
      std::error_code ec;
      std::filesystem::rename(tmp, p, ec);
      MT_CHECK(!ec, "[JsonlLogger] cannot replace '", path, "': ", ec.message());
    }
  }
  file_ = std::fopen(path.c_str(), options.append ? "ab" : "wb");
  MT_CHECK(file_ != nullptr, "[JsonlLogger] cannot open '", path, "': ", std::strerror(errno));
}

JsonlLogger::~JsonlLogger() {
  if (file_) std::fclose(file_);
}

void JsonlLogger::log(int64_t step, const std::string& split, const std::map<std::string, double>& values) {
  nlohmann::ordered_json j;
  j["step"] = step;
  j["split"] = split;
  for (const auto& [name, value] : values) {
    MT_CHECK(name != "step" && name != "split", "[JsonlLogger] metric name '", name, "' clashes with a reserved key");
    j[name] = value;  // nlohmann writes non-finite doubles as null
  }
  std::string line = j.dump() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  MT_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
           "[JsonlLogger] write to '", path_, "' failed: ", std::strerror(errno));
}

void JsonlLogger::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fflush(file_);
}

}  // namespace mt::train
