#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/example.h"

namespace mt::data {

struct JsonlOptions {
  // Keys to keep, in this order; each must be present on every line. Empty keeps every
  // key of each line in the line's order.
  std::vector<std::string> columns{};
  int64_t limit = -1;  // read at most this many rows (< 0: all)
};

// Reads one JSON object per line (blank lines skipped, BOM removed). Strings stay
// strings, integers and booleans become int64, other numbers double, arrays of integers
// token lists; anything else (objects, other arrays, null) is kept as its JSON text.
// Bad JSON, a non-object line or a missing key throw mt::Error
// "[read_jsonl] <path>:<line>[:<column>]: ...".
std::vector<Example> read_jsonl(const std::string& path, const JsonlOptions& options = {});

}  // namespace mt::data
