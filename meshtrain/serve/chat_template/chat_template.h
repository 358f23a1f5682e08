#pragma once
// Hugging Face chat templates: the Jinja2 string a model directory's tokenizer_config.json keeps
// under "chat_template", rendered the way transformers' apply_chat_template renders it (an
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension,
// its own `tojson` filter and the `raise_exception` and `strftime_now` globals).
//
// The interpreter is our own (lexer -> AST -> evaluator) and covers the Jinja subset that chat
// templates use: output, if/elif/else, for (loop variables, else, tuple targets, inline filter),
// set (plain, namespace attribute, block), macros, break/continue, raw, comments and whitespace
// control; the expression grammar with Jinja's precedences; Python semantics for values (truth,
// comparison, arithmetic, str()/repr() output) and the filters, tests and str/dict methods those
// templates call. Unknown filters and tests are parse errors, as in Jinja.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::serve {

namespace chat_template_detail {
struct Program;
}

// A parsed template: parse once, render per request; rendering is const and thread-safe.
class ChatTemplate {
 public:
  // Throws mt::Error("[chat_template] line L, column C: ...") naming what was expected.
  explicit ChatTemplate(std::string source);

  // Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token,
  // eos_token, tools, anything else the caller adds). raise_exception(msg) in the template
  // throws mt::Error("[chat_template] " + msg); other runtime failures (an undefined value used,
  // a type error) throw mt::Error naming the template line.
  //
  // JSON objects arrive with nlohmann's sorted keys, so a dict printed or dumped by the template
  // lists its keys in that order, where Python would keep the order of the caller's JSON.
  std::string render(const nlohmann::json& variables) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const chat_template_detail::Program> program_;
};

}  // namespace mt::serve
