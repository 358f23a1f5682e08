#pragma once
// Hugging Face `tokenizers` (PyPI, the 0.23 line, in .venv/tokenizers-oracle) as the oracle of the
// tokenizer conformance tests: the inputs (every GLUE sentence/pair, every Tiny Shakespeare
// line, Unicode edge cases), one oracle run per tokenizer setting, and the comparison that
// prints the counts and the first mismatches.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/tokenizers/tokenizer.h"
#include "tests/support/tokenizer_inputs.h"

namespace mt::test {

double seconds_since(std::chrono::steady_clock::time_point t0);

// All conformance inputs (GLUE + Tiny Shakespeare), read once.
const std::vector<TextInput>& all_inputs();
// Empty, whitespace-only, Unicode (accents, CJK, emoji, controls, combining marks), long words,
// added-token look-alikes; each alone and in pairs.
std::vector<TextInput> edge_cases();

struct Result {
  bool error = false;
  std::vector<int32_t> ids, type_ids, mask;
  bool has_mask = false;
  std::string decoded;
  bool has_decoded = false;
};

// Runs tests/python/hf_encode.py with `args` on the inputs; one Result per input.
std::vector<Result> run_oracle(const std::string& args, const std::vector<TextInput>& inputs);

// The first 40 ids, for messages.
std::string ids_str(const std::vector<int32_t>& ids);

// Encodes like the oracle and compares (gtest expectations); prints the counts and the first
// mismatches. `batch` encodes the whole set in one encode_batch call (needed for padding to
// longest). `odd_split` (longest_first pairs with an odd budget): an input whose cut differs
// from Hugging Face's only in which sequence keeps the odd token is counted, not failed.
void compare(const std::string& label, const tokenizers::Tokenizer& tok, const std::vector<TextInput>& inputs,
             const std::vector<Result>& expected, bool batch = false, bool add_special = true,
             bool odd_split = false);

}  // namespace mt::test
