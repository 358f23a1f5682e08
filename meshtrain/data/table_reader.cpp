#include "meshtrain/data/table_reader.h"

#include <string_view>

#include "meshtrain/core/error.h"
#include "meshtrain/data/text_file.h"

namespace mt::data {

namespace {

// One parsed row with where each field starts, so errors can point at it.
struct Record {
  std::vector<std::string> fields;
  std::vector<int64_t> field_lines;  // 1-based line of each field's first byte
  std::vector<int64_t> field_cols;   // 1-based byte column of each field's first byte
  int64_t line = 0;                  // line where the row starts
};

// Splits delimited text into rows. With quoting, a field that starts with '"' runs to
// the matching quote and may hold separators, newlines and doubled quotes; a quote
// anywhere else is an ordinary character (as in GLUE's TSVs).
class RecordReader {
 public:
  RecordReader(std::string_view text, char delimiter, bool quoting, const std::string& source, const char* op)
      : text_(text), delimiter_(delimiter), quoting_(quoting), source_(source), op_(op) {}

  bool next(Record& rec) {
    const size_t n = text_.size();
    while (pos_ < n) {  // skip empty lines
      if (text_[pos_] == '\n') {
        new_line(pos_ + 1);
      } else if (text_[pos_] == '\r' && (pos_ + 1 == n || text_[pos_ + 1] == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
    if (pos_ >= n) return false;
    rec.fields.clear();
    rec.field_lines.clear();
    rec.field_cols.clear();
    rec.line = line_;
    while (true) {
      rec.field_lines.push_back(line_);
      rec.field_cols.push_back(column());
      std::string field;
      if (quoting_ && pos_ < n && text_[pos_] == '"') {
        read_quoted(field, rec.fields.size() + 1);
      } else {
        const size_t start = pos_;
        while (pos_ < n && text_[pos_] != delimiter_ && text_[pos_] != '\n') ++pos_;
        size_t end = pos_;
        if ((pos_ == n || text_[pos_] == '\n') && end > start && text_[end - 1] == '\r') --end;
        field.assign(text_.substr(start, end - start));
      }
      rec.fields.push_back(std::move(field));
      if (pos_ < n && text_[pos_] == '\r') ++pos_;  // CR of a CRLF after a closing quote
      if (pos_ >= n) return true;
      if (text_[pos_] == '\n') {
        new_line(pos_ + 1);
        return true;
      }
      ++pos_;  // the delimiter
    }
  }

 private:
  int64_t column() const { return int64_t(pos_ - line_start_) + 1; }
  void new_line(size_t next) {
    pos_ = next;
    ++line_;
    line_start_ = next;
  }

  void read_quoted(std::string& field, size_t field_number) {
    const size_t n = text_.size();
    const int64_t open_line = line_, open_col = column();
    ++pos_;
    while (true) {
      MT_CHECK(pos_ < n, "[", op_, "] ", source_, ":", open_line, ":", open_col, ": the quoted field ", field_number,
               " opened here is never closed (end of file reached)");
      const char c = text_[pos_];
      if (c == '"') {
        if (pos_ + 1 < n && text_[pos_ + 1] == '"') {
          field += '"';
          pos_ += 2;
          continue;
        }
        ++pos_;
        break;
      }
      field += c;
      if (c == '\n') {
        new_line(pos_ + 1);
      } else {
        ++pos_;
      }
    }
    if (pos_ < n) {
      const char c = text_[pos_];
      const bool ok = c == delimiter_ || c == '\n' || (c == '\r' && (pos_ + 1 == n || text_[pos_ + 1] == '\n'));
      MT_CHECK(ok, "[", op_, "] ", source_, ":", line_, ":", column(), ": unexpected character '", c,
               "' after the closing quote of field ", field_number,
               " (a quote inside a quoted field must be doubled: \"\")");
    }
  }

  std::string_view text_;
  char delimiter_;
  bool quoting_;
  const std::string& source_;
  const char* op_;
  size_t pos_ = 0;
  size_t line_start_ = 0;
  int64_t line_ = 1;
};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "'" : ", '") + name + "'";
  return out;
}

std::string quoted_excerpt(const std::string& s) { return describe(Value(s)); }

}  // namespace

std::vector<Example> parse_table(const std::string& text, const std::string& source, const TableOptions& options,
                                 char default_delimiter, bool default_quoting, const char* op) {
  const char delimiter = options.delimiter.value_or(default_delimiter);
  const bool quoting = options.quoting.value_or(default_quoting);
  MT_CHECK(delimiter != '"' && delimiter != '\n' && delimiter != '\r', "[", op, "] ", source,
           ": the delimiter cannot be a quote or a line break");
  RecordReader reader(text, delimiter, quoting, source, op);
  Record rec;
  bool pending_row = false;  // rec holds a data row read ahead to learn the width
  std::vector<std::string> names;
  std::string where = source;  // where column names come from, for errors
  if (options.header) {
    if (!reader.next(rec)) return {};
    names = rec.fields;
    where = detail::concat(source, ":", rec.line);
    if (!options.column_names.empty()) {
      MT_CHECK(options.column_names.size() == names.size(), "[", op, "] ", where, ": column_names has ",
               options.column_names.size(), " names but the header has ", names.size(), " columns (",
               join(names), ")");
      names = options.column_names;
    }
  } else if (!options.column_names.empty()) {
    names = options.column_names;
  } else {
    if (!reader.next(rec)) return {};
    pending_row = true;
    for (size_t i = 0; i < rec.fields.size(); ++i) names.push_back(std::to_string(i));
  }
  const size_t width = names.size();

  // Resolve the selection once: source index and output name of each kept field.
  std::vector<size_t> selected;
  if (options.columns.empty()) {
    for (size_t i = 0; i < width; ++i) selected.push_back(i);
  }
  for (const Column& col : options.columns) {
    if (!col.name.empty()) {
      size_t i = 0;
      while (i < width && names[i] != col.name) ++i;
      MT_CHECK(i < width, "[", op, "] ", where, ": column '", col.name, "' not found; the columns are ", join(names),
               options.header || !options.column_names.empty() ? "" : " (no header: give column_names or select by index)");
      selected.push_back(i);
    } else {
      MT_CHECK(col.index >= 0 && size_t(col.index) < width, "[", op, "] ", where, ": column index ", col.index,
               " is out of range for ", width, " columns (", join(names), ")");
      selected.push_back(size_t(col.index));
    }
  }
  std::vector<std::string> out_names;
  for (size_t i : selected) {
    for (const auto& prev : out_names) {
      MT_CHECK(prev != names[i], "[", op, "] ", where, ": column '", names[i],
               "' is selected twice or the name repeats; rename with column_names");
    }
    out_names.push_back(names[i]);
  }
  std::vector<FieldType> types(selected.size(), FieldType::string);
  for (const auto& [name, type] : options.types) {
    size_t k = 0;
    while (k < out_names.size() && out_names[k] != name) ++k;
    MT_CHECK(k < out_names.size(), "[", op, "] ", where, ": types names column '", name,
             "', which is not among the selected columns ", join(out_names));
    types[k] = type;
  }

  std::vector<Example> rows;
  auto add_row = [&](Record& r) {
    if (r.fields.size() < width) {
      MT_CHECK(false, "[", op, "] ", source, ":", r.line, ": row has ", r.fields.size(), " fields, expected ", width,
               ": column ", r.fields.size() + 1, " ('", names[r.fields.size()], "') is missing");
    }
    if (r.fields.size() > width) {
      MT_CHECK(false, "[", op, "] ", source, ":", r.field_lines[width], ":", r.field_cols[width], ": row has ",
               r.fields.size(), " fields, expected ", width, ": unexpected field ", width + 1, " ",
               quoted_excerpt(r.fields[width]));
    }
    Example ex;
    for (size_t k = 0; k < selected.size(); ++k) {
      const size_t i = selected[k];
      std::string& field = r.fields[i];
      if (types[k] == FieldType::string) {
        ex.set(out_names[k], std::move(field));
      } else if (types[k] == FieldType::int64) {
        int64_t v = 0;
        MT_CHECK(parse_int64(field, v), "[", op, "] ", source, ":", r.field_lines[i], ":", r.field_cols[i],
                 ": column '", out_names[k], "' (field ", i + 1, "): ", quoted_excerpt(field), " is not an integer");
        ex.set(out_names[k], v);
      } else {
        double v = 0;
        MT_CHECK(parse_float64(field, v), "[", op, "] ", source, ":", r.field_lines[i], ":", r.field_cols[i],
                 ": column '", out_names[k], "' (field ", i + 1, "): ", quoted_excerpt(field), " is not a number");
        ex.set(out_names[k], v);
      }
    }
    rows.push_back(std::move(ex));
  };
  const auto limit_reached = [&] { return options.limit >= 0 && int64_t(rows.size()) >= options.limit; };
  if (pending_row && !limit_reached()) add_row(rec);
  while (!limit_reached() && reader.next(rec)) add_row(rec);
  return rows;
}

std::vector<Example> read_tsv(const std::string& path, const TableOptions& options) {
  return parse_table(read_text_file(path, "read_tsv"), path, options, '\t', false, "read_tsv");
}

std::vector<Example> read_csv(const std::string& path, const TableOptions& options) {
  return parse_table(read_text_file(path, "read_csv"), path, options, ',', true, "read_csv");
}

}  // namespace mt::data
