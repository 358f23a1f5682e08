#include "meshtrain/data/documents.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/data/text_file.h"
#include "meshtrain/io/mapped_file.h"

namespace mt::data {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

void add_document(std::string_view doc, std::vector<std::string_view>& out) {
  while (!doc.empty() && (doc.front() == '\n' || doc.front() == '\r')) doc.remove_prefix(1);
  while (!doc.empty() && (doc.back() == '\n' || doc.back() == '\r')) doc.remove_suffix(1);
  if (doc.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos) return;
  out.push_back(doc);
}

bool is_percent_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line == "%";
}

bool has_percent_line(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    if (is_percent_line(text.substr(pos, end - pos))) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace

std::vector<std::string> split_documents(std::string_view text, const DocumentSplit& split) {
  std::vector<std::string> docs;
  for (std::string_view d : split_document_views(text, split)) docs.emplace_back(d);
  return docs;
}

std::vector<std::string_view> split_document_views(std::string_view text, const DocumentSplit& split) {
  DocumentSplit how = split;
  if (how.kind == DocumentSplit::Kind::automatic) {
    if (has_percent_line(text)) {
      how = DocumentSplit::percent_lines();
    } else if (text.find(kEndOfText) != std::string_view::npos) {
      how = DocumentSplit::literal(std::string(kEndOfText));
    } else {
      how = DocumentSplit::none();
    }
  }
  std::vector<std::string_view> docs;
  switch (how.kind) {
    case DocumentSplit::Kind::literal: {
      MT_CHECK(!how.separator.empty(), "[split_documents] the literal separator is empty");
      size_t pos = 0;
      while (true) {
        const size_t hit = text.find(how.separator, pos);
        add_document(text.substr(pos, hit == std::string_view::npos ? std::string_view::npos : hit - pos), docs);
        if (hit == std::string_view::npos) break;
        pos = hit + how.separator.size();
      }
      break;
    }
    case DocumentSplit::Kind::percent_lines: {
      size_t doc_start = 0, pos = 0;
      while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        const size_t next = end == std::string_view::npos ? text.size() : end + 1;
        if (end == std::string_view::npos) end = text.size();
        if (is_percent_line(text.substr(pos, end - pos))) {
          add_document(text.substr(doc_start, pos - doc_start), docs);
          doc_start = next;
        }
        pos = next;
      }
      add_document(text.substr(std::min(doc_start, text.size())), docs);
      break;
    }
    default: add_document(text, docs); break;
  }
  return docs;
}

std::vector<std::string> list_text_files(const std::string& directory) {
  std::error_code ec;
  MT_CHECK(fs::is_directory(directory, ec), "[read_documents] ", directory, ": not a directory");
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const fs::path& p = entry.path();
    const std::string name = p.filename().string();
    const std::string ext = p.extension().string();
    if (name.empty() || name.front() == '.' || ext == ".dat" || ext == ".u8") continue;
    if (!entry.is_regular_file(ec)) continue;
    files.push_back(p.string());
  }
  MT_CHECK(!ec, "[read_documents] ", directory, ": cannot list (", ec.message(), ")");
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> read_documents(const std::string& path, const DocumentSplit& split) {
  const MappedCorpus corpus(path, split);
  return {corpus.documents().begin(), corpus.documents().end()};
}

MappedCorpus::MappedCorpus(const std::string& path, const DocumentSplit& split) {
  std::error_code ec;
  MT_CHECK(fs::exists(path, ec), "[read_documents] ", path, ": no such file or directory");
  std::vector<std::string> files{path};
  if (fs::is_directory(path, ec)) {
    files = list_text_files(path);
    MT_CHECK(!files.empty(), "[read_documents] ", path, ": the directory has no text files");
  }
  // Files under 1 MiB, and what is not a regular file (a pipe, /dev/stdin), are read into
  // memory: a folder of many small files would otherwise take a mapping each (the kernel
  // allows some 65k per process), and a pipe cannot be mapped.
  constexpr uintmax_t kMapFrom = uintmax_t(1) << 20;
  for (const std::string& file : files) {
    std::string_view text;
    if (fs::is_regular_file(file, ec) && fs::file_size(file, ec) >= kMapFrom) {
      files_.push_back(io::MappedFile::open(file, "read_documents"));
      text = without_bom(std::string_view(reinterpret_cast<const char*>(files_.back()->data()), files_.back()->size()));
    } else {
      copies_.push_back(std::make_unique<std::string>(read_text_file(file, "read_documents")));
      text = *copies_.back();
    }
    std::vector<std::string_view> part = split_document_views(text, split);
    documents_.insert(documents_.end(), part.begin(), part.end());
    release(text);  // the split read every page; the pass that encodes reads them again
  }
}

void MappedCorpus::release(std::string_view text) const {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(text.data()), to = from + text.size();
  for (const auto& f : files_) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(f->data());
    if (text.empty() || from < base || to > base + f->size()) continue;
    // 1 MiB before `text` goes too: faulting a page maps its already-cached neighbours
    // (fault-around), also those of text released before. Dropping a page of a private,
    // never-written file mapping loses nothing: touched again, it is read from the page
    // cache or the file. (The mapping ends on a page boundary, so rounding `to` up stays in it.)
    const uintptr_t begin = (from - std::min(from - base, uintptr_t(1) << 20)) / page * page;
    const uintptr_t end = (to + page - 1) / page * page;
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    return;
  }
  // Text read into memory (or not from this corpus) stays as it is.
}

std::vector<std::string_view> cut_at_lines(std::string_view text, size_t piece_bytes) {
  MT_CHECK(piece_bytes > 0, "[cut_at_lines] pieces of 0 bytes");
  // ASCII only: a non-ASCII character before the newline may be Unicode whitespace (U+00A0),
  // which the tokenizers join with the newline into one pre-token.
  const auto ascii_visible = [](char c) { return c > ' ' && c < 0x7f; };
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  std::vector<std::string_view> pieces;
  size_t start = 0;
  while (text.size() - start > piece_bytes) {
    size_t cut = std::string_view::npos;
    for (size_t at = text.find('\n', start + piece_bytes); at != std::string_view::npos; at = text.find('\n', at + 1))
      if (at > 0 && at + 1 < text.size() && ascii_visible(text[at - 1]) && alnum(text[at + 1])) {
        cut = at + 1;
        break;
      }
    if (cut == std::string_view::npos) break;
    pieces.push_back(text.substr(start, cut - start));
    start = cut;
  }
  pieces.push_back(text.substr(start));
  return pieces;
}

}  // namespace mt::data
