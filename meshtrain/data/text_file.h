#pragma once
#include <string>
#include <string_view>

namespace mt::data {

// The whole file as bytes with a leading UTF-8 byte-order mark removed (GLUE's MRPC
// files start with one). Throws mt::Error "[op] <path>: ..." if it cannot be read.
std::string read_text_file(const std::string& path, const char* op = "read_text_file");

// `text` without a leading UTF-8 byte-order mark.
std::string_view without_bom(std::string_view text);

}  // namespace mt::data
