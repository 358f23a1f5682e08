#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mt::io {
class MappedFile;
}

namespace mt::data {

// How a text corpus is cut into documents.
struct DocumentSplit {
  enum class Kind {
    automatic,      // percent_lines if some line is just "%", else literal "<|endoftext|>" if present, else none
    literal,        // on every occurrence of `separator` (e.g. "<|endoftext|>")
    percent_lines,  // on lines holding only "%" (the fortune(6) file format)
    none,           // the whole file is one document
  };
  Kind kind = Kind::automatic;
  std::string separator{};

  static DocumentSplit automatic() { return {}; }
  static DocumentSplit literal(std::string separator) { return {Kind::literal, std::move(separator)}; }
  static DocumentSplit percent_lines() { return {Kind::percent_lines, {}}; }
  static DocumentSplit none() { return {Kind::none, {}}; }
};

// Splits text into documents. Line breaks at both ends of a document are removed (other
// whitespace is kept: it matters in ASCII art) and empty or all-whitespace documents
// are dropped.
std::vector<std::string> split_documents(std::string_view text, const DocumentSplit& split = {});
// The same documents as views into `text`.
std::vector<std::string_view> split_document_views(std::string_view text, const DocumentSplit& split = {});

// The documents of a file, or of every text file of a directory in name order. In a
// directory, subdirectories, hidden files and fortune's ".dat" index files and ".u8"
// links are skipped; `automatic` decides per file. Throws mt::Error naming the path if
// it is missing or a directory has no text files.
std::vector<std::string> read_documents(const std::string& path, const DocumentSplit& split = {});

// read_documents without a copy of the corpus: files of 1 MiB and more are memory-mapped and
// their documents are views into them, so a corpus larger than memory can be walked a document
// at a time (the kernel reads pages on first touch and may evict them: they are the file's);
// smaller files and pipes are read. release() gives a stretch of mapped text's pages back once
// a pass is done with it, which keeps this process's resident memory to what it works on.
class MappedCorpus {
 public:
  explicit MappedCorpus(const std::string& path, const DocumentSplit& split = {});
  const std::vector<std::string_view>& documents() const { return documents_; }
  void release(std::string_view text) const;

 private:
  std::vector<std::shared_ptr<io::MappedFile>> files_;  // files of 1 MiB and more
  std::vector<std::unique_ptr<std::string>> copies_;    // smaller files and pipes, read
  std::vector<std::string_view> documents_;
};

// `text` cut into pieces of about `piece_bytes` or more, each cut just after a lone newline
// between a visible ASCII character and an ASCII letter or digit ("...x\nY..."): the first such
// newline at or past each piece_bytes boundary. Where no such newline comes, the piece runs
// on. For tokenizers whose pre-tokens never cross such a newline
// (Tokenizer::newline_cuts_are_exact) the pieces encode to the whole text's ids.
std::vector<std::string_view> cut_at_lines(std::string_view text, size_t piece_bytes);

// The files read_documents takes from a directory, sorted by name.
std::vector<std::string> list_text_files(const std::string& directory);

}  // namespace mt::data
