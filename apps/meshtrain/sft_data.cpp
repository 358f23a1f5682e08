#include "apps/meshtrain/sft_data.h"

#include <filesystem>

#include "apps/meshtrain/flag_checks.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/documents.h"
#include "meshtrain/data/jsonl_reader.h"
#include "meshtrain/data/table_reader.h"

namespace mt::cli {

namespace fs = std::filesystem;

namespace {

const std::string kPrompt = "{prompt}", kResponse = "{response}";

std::string lower_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

std::string replace_first(std::string s, const std::string& what, const std::string& with) {
  size_t at = s.find(what);
  if (at != std::string::npos) s.replace(at, what.size(), with);
  return s;
}

// The rows of the file with the named fields (in that order).
std::vector<data::Example> read_rows(const std::string& path, const std::vector<std::string>& fields) {
  const std::string ext = lower_extension(path);
  if (ext == ".jsonl" || ext == ".json") {
    data::JsonlOptions o;
    o.columns = fields;
    return data::read_jsonl(path, o);
  }
  if (ext == ".csv" || ext == ".tsv") {
    data::TableOptions o;
    for (const std::string& f : fields) o.columns.emplace_back(f);
    return ext == ".csv" ? data::read_csv(path, o) : data::read_tsv(path, o);
  }
  // Plain text: one document per example, the text field.
  MT_CHECK(fields.size() == 1, "[finetune] ", path, ": a text file has no fields; prompt/response pairs need a .jsonl, "
           ".csv or .tsv file");
  std::vector<data::Example> rows;
  for (std::string& doc : data::read_documents(path)) rows.push_back(data::Example{{fields[0], std::move(doc)}});
  return rows;
}

std::string field_text(const data::Example& row, const std::string& field, const std::string& path, size_t index) {
  const data::Value& v = row.at(field);
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return data::describe(*d);
  throw Error("[finetune] " + path + ": row " + std::to_string(index + 1) + ": field '" + field + "' is not text (" +
              data::describe(v) + ")");
}

// Fixed-length examples from records: padded one per sequence, or packed back to back.
std::vector<data::Example> to_sequences(const std::vector<SftRecord>& records, int64_t seq_len, bool packing,
                                        int64_t pad_id, int64_t& truncated) {
  const size_t n = size_t(seq_len + 1);
  std::vector<data::Example> out;
  auto targets_of = [](const SftRecord& r) {
    std::vector<int64_t> t(r.tokens);
    for (size_t i = 0; i < r.prompt_tokens && i < t.size(); ++i) t[i] = -100;
    return t;
  };
  if (!packing) {
    for (const SftRecord& r : records) {
      std::vector<int64_t> tokens = r.tokens, targets = targets_of(r);
      if (tokens.size() > n) ++truncated;
      tokens.resize(n, pad_id);
      targets.resize(n, -100);
      out.push_back(data::Example{{"tokens", std::move(tokens)}, {"targets", std::move(targets)}});
    }
    return out;
  }
  std::vector<int64_t> tokens, targets;
  for (const SftRecord& r : records) {
    std::vector<int64_t> t = targets_of(r);
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    targets.insert(targets.end(), t.begin(), t.end());
  }
  // Sequence k covers stream positions [k·seq_len, k·seq_len + seq_len]: every position is a
  // target exactly once.
  for (size_t start = 0; start + n <= tokens.size(); start += size_t(seq_len))
    out.push_back(data::Example{{"tokens", std::vector<int64_t>(tokens.begin() + long(start), tokens.begin() + long(start + n))},
                                {"targets", std::vector<int64_t>(targets.begin() + long(start), targets.begin() + long(start + n))}});
  return out;
}

}  // namespace

void add_sft_data_flags(CLI::App* cmd, SftFlags& f) {
  cmd->add_option("--data", f.data, "training rows: .jsonl, .csv, .tsv (fields) or a text file")
      ->required()
      ->check(CLI::ExistingPath);
  auto* text = cmd->add_option("--text-field", f.text_field, "causal LM on this field (default: \"text\")");
  auto* prompt = cmd->add_option("--prompt-field", f.prompt_field,
                                 "supervised fine-tuning: the prompt's field (loss only on the response)");
  auto* response = cmd->add_option("--response-field", f.response_field, "the response's field");
  prompt->needs(response);
  response->needs(prompt);
  text->excludes(prompt);
  cmd->add_option("--template", f.template_text, "how a pair reads as text: {prompt} and {response}")
      ->capture_default_str();
  cmd->add_option("--seq-len", f.seq_len, "tokens per training sequence")->capture_default_str()->check(positive());
  cmd->add_flag("--packing", f.packing, "pack rows back to back into full sequences (default: one padded row each)");
  add_boolean_flag(cmd, "--pad-to-max-length,--pad_to_max_length", f.pad_to_max_length,
                   "unpacked rows: every batch --seq-len long (default: each batch cut after its last target token, "
                   "rounded up to a multiple of 8, as TRL pads to the longest row; data ranks pad to the ranks' longest)");
  cmd->add_option("--eval-fraction", f.eval_fraction, "share of the rows (the last ones) held out for eval loss")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
}

std::string prompt_text(const std::string& template_text, const std::string& prompt) {
  const size_t at = template_text.find(kResponse);
  return replace_first(template_text.substr(0, at), kPrompt, prompt);
}

SftCorpus make_sft_corpus(const SftFlags& f, const tokenizers::Tokenizer& tok, std::optional<int64_t> eos_id) {
  SftCorpus c;
  c.supervised = !f.prompt_field.empty();
  std::vector<std::string> fields =
      c.supervised ? std::vector<std::string>{f.prompt_field, f.response_field}
                   : std::vector<std::string>{f.text_field.empty() ? std::string("text") : f.text_field};
  if (c.supervised) {
    const size_t r = f.template_text.find(kResponse);
    MT_CHECK(r != std::string::npos && f.template_text.find(kResponse, r + 1) == std::string::npos,
             "[finetune] --template must contain {response} once, got '", f.template_text, "'");
    const size_t p = f.template_text.find(kPrompt);
    MT_CHECK(p != std::string::npos && p < r, "[finetune] --template must contain {prompt} before {response}, got '",
             f.template_text, "'");
  }
  std::vector<data::Example> rows = read_rows(f.data, fields);
  MT_CHECK(!rows.empty(), "[finetune] ", f.data, " has no rows");
  std::vector<SftRecord> records;
  std::vector<std::pair<std::string, std::string>> pairs;
  auto encode = [&](const std::string& text, bool special) {
    tokenizers::Encoding e = tok.encode(text, special);
    return std::vector<int64_t>(e.ids.begin(), e.ids.end());
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    SftRecord r;
    if (c.supervised) {
      const std::string prompt = field_text(rows[i], fields[0], f.data, i);
      const std::string response = field_text(rows[i], fields[1], f.data, i);
      const size_t at = f.template_text.find(kResponse);
      // The prompt part as generation will see it (special tokens such as LLaMA's BOS
      // included); the response and the template's tail after it are the targets.
      r.tokens = encode(prompt_text(f.template_text, prompt), true);
      r.prompt_tokens = r.tokens.size();
      std::vector<int64_t> rest = encode(response + f.template_text.substr(at + kResponse.size()), false);
      r.tokens.insert(r.tokens.end(), rest.begin(), rest.end());
      pairs.emplace_back(prompt, response);
    } else {
      r.tokens = encode(field_text(rows[i], fields[0], f.data, i), false);
    }
    if (eos_id) r.tokens.push_back(*eos_id);
    records.push_back(std::move(r));
  }
  c.rows = int64_t(records.size());
  c.eval_rows = f.eval_fraction > 0 ? std::max<int64_t>(1, int64_t(double(c.rows) * f.eval_fraction)) : 0;
  MT_CHECK(c.eval_rows < c.rows, "[finetune] ", f.data, ": ", c.rows, " rows leave none for training after holding out ",
           c.eval_rows);
  const size_t split = size_t(c.rows - c.eval_rows);
  for (const SftRecord& r : records) c.target_tokens += int64_t(r.tokens.size() - r.prompt_tokens);
  for (size_t i = split; i < pairs.size(); ++i) {
    c.eval_prompts.push_back(pairs[i].first);
    c.eval_responses.push_back(pairs[i].second);
  }
  const int64_t pad = eos_id.value_or(0);
  std::vector<SftRecord> train(records.begin(), records.begin() + long(split)), eval(records.begin() + long(split), records.end());
  std::vector<data::Example> train_seq = to_sequences(train, f.seq_len, f.packing, pad, c.truncated);
  MT_CHECK(!train_seq.empty(), "[finetune] ", f.data, ": the training rows fill no sequence of ", f.seq_len + 1,
           " tokens (lower --seq-len or drop --packing)");
  c.train = data::make_dataset(std::move(train_seq));
  if (!eval.empty()) c.eval = data::make_dataset(to_sequences(eval, f.seq_len, f.packing, pad, c.truncated));
  return c;
}

}  // namespace mt::cli
