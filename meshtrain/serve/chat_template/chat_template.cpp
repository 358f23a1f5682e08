// Hugging Face chat templates (chat_template.h): lex and parse once, render per request with a
// fresh evaluator over the shared, read-only syntax tree.
#include "meshtrain/serve/chat_template/chat_template.h"

#include "meshtrain/core/error.h"
#include "meshtrain/serve/chat_template/ast.h"
#include "meshtrain/serve/chat_template/eval.h"

namespace mt::serve {

namespace chat_template_detail {
struct Program {
  ProgramTree tree;
};
}  // namespace chat_template_detail

ChatTemplate::ChatTemplate(std::string source) : source_(std::move(source)) {
  using namespace chat_template_detail;
  auto program = std::make_shared<Program>();
  program->tree = parse_template(lex_template(source_));
  program_ = std::move(program);
}

std::string ChatTemplate::render(const nlohmann::json& variables) const {
  using namespace chat_template_detail;
  MT_CHECK(variables.is_object() || variables.is_null(), "[chat_template] the variables of a render must be a JSON object, got ",
           variables.type_name());
  const Value vars = variables.is_null() ? Value::dict_of(Dict{}) : from_json(variables);
  Interp interp(program_->tree, vars);
  try {
    return interp.render();
  } catch (const RuntimeFail& f) {  // failures outside any expression (should not happen)
    throw mt::Error(std::string("[chat_template] ") + f.what());
  }
}

}  // namespace mt::serve
