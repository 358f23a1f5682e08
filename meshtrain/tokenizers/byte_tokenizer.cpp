#include "meshtrain/tokenizers/byte_tokenizer.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "meshtrain/io/mapped_file.h"
#include "meshtrain/tokenizers/bpe.h"
#include "meshtrain/tokenizers/unicode.h"

namespace mt::tokenizers {

void write_byte_tokenizer(const std::string& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  const auto codepoints = byte_to_codepoint();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    unicode::append_utf8(symbol, codepoints[size_t(b)]);
    vocab[symbol] = b;
  }
  vocab["<|endoftext|>"] = kByteTokenizerEndOfText;
  io::write_file_atomic((std::filesystem::path(dir) / "vocab.json").string(), vocab.dump());
  io::write_file_atomic((std::filesystem::path(dir) / "merges.txt").string(), "#version: 0.2\n");
}

std::shared_ptr<Tokenizer> make_byte_tokenizer(const std::string& dir) {
  write_byte_tokenizer(dir);
  return load_tokenizer(dir);
}

}  // namespace mt::tokenizers
