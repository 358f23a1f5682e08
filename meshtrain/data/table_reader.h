#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/data/example.h"

namespace mt::data {

// The type a column is converted to while reading; conversion errors name file, line
// and column, which a later Example::as_int could not.
enum class FieldType { string, int64, float64 };

// A column chosen by its name (header or column_names) or by its 0-based index.
struct Column {
  Column(const char* name) : name(name) {}
  Column(std::string name) : name(std::move(name)) {}
  Column(int index) : index(index) {}
  std::string name;
  int index = -1;  // used when name is empty
};

struct TableOptions {
  // The first row holds the column names. GLUE's CoLA train/dev have no header.
  bool header = true;
  // Names of the columns: required to select by name in a headerless file; with a header
  // they replace its names (same count). Without either, columns are named "0", "1", ...
  std::vector<std::string> column_names{};
  // Columns to keep, in this order (the Example's field order); empty keeps all. A column
  // picked by index is named by the header / column_names.
  std::vector<Column> columns{};
  // Conversions by output field name; unlisted fields stay strings.
  std::map<std::string, FieldType> types{};
  // Double-quote quoting (RFC 4180: "" is a quote, separators and newlines allowed
  // inside). Default: on for CSV, off for TSV, whose GLUE files contain bare quotes.
  std::optional<bool> quoting{};
  std::optional<char> delimiter{};  // default '\t' for TSV, ',' for CSV
  int64_t limit = -1;             // read at most this many rows (< 0: all)
};

// Reads a delimited file into one Example per row. A leading UTF-8 BOM is removed, CRLF
// line ends are accepted and empty lines are skipped. Rows with the wrong field count,
// unknown columns, unterminated quotes and failed conversions throw mt::Error
// "[read_tsv] <path>:<line>[:<column>]: ...".
std::vector<Example> read_tsv(const std::string& path, const TableOptions& options = {});
std::vector<Example> read_csv(const std::string& path, const TableOptions& options = {});

// The same parser on text in memory; `source` names it in errors, `op` prefixes them.
std::vector<Example> parse_table(const std::string& text, const std::string& source, const TableOptions& options,
                                 char default_delimiter, bool default_quoting, const char* op = "parse_table");

}  // namespace mt::data
