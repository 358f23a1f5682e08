#include "meshtrain/data/text_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/error.h"

namespace mt::data {

std::string read_text_file(const std::string& path, const char* op) {
  std::error_code ec;
  MT_CHECK(std::filesystem::exists(path, ec), "[", op, "] ", path, ": no such file");
  MT_CHECK(!std::filesystem::is_directory(path, ec), "[", op, "] ", path, ": is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[", op, "] ", path, ": cannot open (", std::strerror(errno), ")");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  MT_CHECK(!in.bad(), "[", op, "] ", path, ": read error");
  std::string text = std::move(buffer).str();
  text.erase(0, text.size() - without_bom(text).size());
  return text;
}

std::string_view without_bom(std::string_view text) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  return text;
}

}  // namespace mt::data
