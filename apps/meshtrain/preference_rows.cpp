#include "apps/meshtrain/preference_rows.h"

#include <nlohmann/json.hpp>

#include "apps/meshtrain/flag_checks.h"
#include "apps/meshtrain/jsonl_objects.h"
#include "apps/meshtrain/sft_data.h"
#include "meshtrain/core/error.h"
#include "meshtrain/posttrain/preference_data.h"

namespace mt::cli {

using json = nlohmann::json;

void add_preference_flags(CLI::App* cmd, PreferenceFlags& f) {
  cmd->add_option("--data", f.data, "preference rows (.jsonl): prompt, chosen, rejected — text, or lists of chat messages")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompt-field", f.prompt_field, "the prompt's field")->capture_default_str();
  cmd->add_option("--chosen-field", f.chosen_field, "the preferred response's field")->capture_default_str();
  cmd->add_option("--rejected-field", f.rejected_field, "the dispreferred response's field")->capture_default_str();
  cmd->add_option("--template", f.template_text, "how a text pair reads: {prompt} and {response}")->capture_default_str();
  cmd->add_option("--chat-template", f.chat_template,
                  "a Jinja chat template file for conversational rows (default: the model directory's)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--seq-len", f.seq_len, "tokens per sequence (prompt + response)")->capture_default_str()->check(integer_range(2, 1 << 20));
  cmd->add_option("--eval-fraction", f.eval_fraction, "share of the rows (the last ones) held out for evaluation")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  add_boolean_flag(cmd, "--pad-to-max-length,--pad_to_max_length", f.pad_to_max_length,
                   "every batch --seq-len long (default: the chosen and the rejected sequences of a batch cut after its "
                   "last response token, rounded up to a multiple of 8, as TRL pads; data ranks pad to the ranks' "
                   "longest)");
}

namespace {

struct Row {
  std::string prompt;         // as generation sees it (template or chat rendering)
  std::string chosen, rejected;  // the responses' text after the prompt
  std::string plain_chosen;   // text rows: the chosen field itself (the held-out answer)
};

std::string text_of(const json& v, const std::string& name, const std::string& at) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return v.dump();
  throw Error(at + "field '" + name + "' is not text (" + v.dump().substr(0, 60) + ")");
}

// Messages: a list of {"role", "content"} objects, or a string taken as one assistant turn.
json messages_of(const json& v, const std::string& name, const std::string& at) {
  if (v.is_string()) return json::array({{{"role", "assistant"}, {"content", v}}});
  MT_CHECK(v.is_array() && !v.empty(), at, "field '", name, "' is neither text nor a list of messages");
  for (const json& m : v)
    MT_CHECK(m.is_object() && m.contains("role") && m.contains("content") && m["role"].is_string() &&
                 m["content"].is_string(),
             at, "field '", name, "' holds a message without a string role and content: ", m.dump().substr(0, 80));
  return v;
}

std::string render(const json& messages, const serve::ServedModel& chat, bool generation_prompt, const std::string& at) {
  try {
    return serve::render_chat(messages, chat, generation_prompt);
  } catch (const Error& e) {
    throw Error(at + e.what());
  }
}

// A conversational row: the prompt turns (explicit, or the turns chosen and rejected share)
// rendered with the generation prompt; each response is what the full conversation's
// rendering adds after it.
Row conversation_row(const json& row, const PreferenceFlags& f, const serve::ServedModel& chat, const std::string& at) {
  json chosen = messages_of(required_field(row, f.chosen_field, at), f.chosen_field, at);
  json rejected = messages_of(required_field(row, f.rejected_field, at), f.rejected_field, at);
  json prompt = json::array();
  if (row.contains(f.prompt_field)) {
    prompt = messages_of(row[f.prompt_field], f.prompt_field, at);
  } else {
    size_t shared = 0;
    while (shared < chosen.size() && shared < rejected.size() && chosen[shared] == rejected[shared]) ++shared;
    MT_CHECK(shared > 0, at, "no '", f.prompt_field, "' field and the two conversations share no opening turn");
    for (size_t i = 0; i < shared; ++i) prompt.push_back(chosen[i]);
    chosen = json(std::vector<json>(chosen.begin() + long(shared), chosen.end()));
    rejected = json(std::vector<json>(rejected.begin() + long(shared), rejected.end()));
    MT_CHECK(!chosen.empty() && !rejected.empty(), at, "one conversation is the other's opening: nothing to prefer");
  }
  Row r;
  r.prompt = render(prompt, chat, true, at);
  for (auto [side, out] : {std::pair{&chosen, &r.chosen}, std::pair{&rejected, &r.rejected}}) {
    json all = prompt;
    for (const json& m : *side) all.push_back(m);
    const std::string full = render(all, chat, false, at);
    MT_CHECK(full.compare(0, r.prompt.size(), r.prompt) == 0, at,
             "the chat template does not render the prompt as the start of the conversation, so the response "
             "cannot be told apart (use text rows, or another --chat-template)");
    *out = full.substr(r.prompt.size());
  }
  return r;
}

}  // namespace

PreferenceCorpus make_preference_corpus(const PreferenceFlags& f, const tokenizers::Tokenizer& tok,
                                        std::optional<int64_t> eos_id, const serve::ServedModel& chat) {
  const size_t r = f.template_text.find("{response}"), p = f.template_text.find("{prompt}");
  MT_CHECK(r != std::string::npos && p != std::string::npos && p < r, "[dpo] --template must contain {prompt} before {response}, got '",
           f.template_text, "'");
  const std::string tail = f.template_text.substr(r + std::string("{response}").size());
  PreferenceCorpus c;
  std::vector<Row> rows;
  int kinds = 0;  // 1: text rows seen, 2: conversations seen
  for_each_json_object(f.data, "dpo", [&](const json& row, const std::string& at) {
    const bool conversational = required_field(row, f.chosen_field, at).is_array();
    kinds |= conversational ? 2 : 1;
    MT_CHECK(kinds != 3, at, "text rows and conversations mixed in one file");
    if (conversational) {
      rows.push_back(conversation_row(row, f, chat, at));
      return;
    }
    Row x;
    const std::string prompt = text_of(required_field(row, f.prompt_field, at), f.prompt_field, at);
    x.prompt = prompt_text(f.template_text, prompt);
    x.plain_chosen = text_of(required_field(row, f.chosen_field, at), f.chosen_field, at);
    x.chosen = x.plain_chosen + tail;
    x.rejected = text_of(required_field(row, f.rejected_field, at), f.rejected_field, at) + tail;
    rows.push_back(std::move(x));
  });
  MT_CHECK(!rows.empty(), "[dpo] ", f.data, " has no rows");
  c.conversational = kinds == 2;
  c.rows = int64_t(rows.size());
  c.eval_rows = f.eval_fraction > 0 ? std::max<int64_t>(1, int64_t(double(c.rows) * f.eval_fraction)) : 0;
  MT_CHECK(c.eval_rows < c.rows, "[dpo] ", f.data, ": ", c.rows, " rows leave none for training after holding out ",
           c.eval_rows);
  auto encode = [&](const std::string& text, bool special) {
    tokenizers::Encoding e = tok.encode(text, special);
    return std::vector<int64_t>(e.ids.begin(), e.ids.end());
  };
  // The prompt with its special tokens as generation encodes it (a chat template writes its
  // own); each response followed by the end-of-text id, as TRL appends the EOS.
  const bool prompt_specials = !(c.conversational && chat.chat_template);
  std::vector<data::Example> train, eval;
  for (size_t i = 0; i < rows.size(); ++i) {
    posttrain::PreferencePair pair{encode(rows[i].prompt, prompt_specials), encode(rows[i].chosen, false),
                                   encode(rows[i].rejected, false)};
    if (eos_id) pair.chosen.push_back(*eos_id), pair.rejected.push_back(*eos_id);
    MT_CHECK(!pair.chosen.empty() && !pair.rejected.empty(), "[dpo] ", f.data, ": row ", i + 1,
             " has an empty response and the tokenizer no end-of-text token to stand for it");
    bool cut = false;
    data::Example e = posttrain::preference_example(pair, f.seq_len, eos_id.value_or(0), &cut);
    c.truncated += cut;
    const bool held_out = int64_t(i) >= c.rows - c.eval_rows;
    (held_out ? eval : train).push_back(std::move(e));
    if (held_out && !c.conversational) {
      c.eval_prompts.push_back(rows[i].prompt);
      c.eval_chosen.push_back(rows[i].plain_chosen);
    }
  }
  c.train = data::make_dataset(std::move(train));
  if (!eval.empty()) c.eval = data::make_dataset(std::move(eval));
  return c;
}

}  // namespace mt::cli
