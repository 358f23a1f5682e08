#pragma once
// A model directory's chat template, as the commands that render conversations find it
// (serve's chat completions, dpo's conversational rows).
#include <string>

#include "meshtrain/serve/openai_protocol.h"

namespace mt::cli {

// The model directory's chat template (chat_template.jinja, or tokenizer_config.json's
// "chat_template": a string, or a list of named templates of which "default" is used),
// with the BOS / EOS texts it refers to, into `m`; `override_file` (--chat-template) wins.
// Nothing is set when there is none. Errors name `command` ("[serve] ...").
void load_chat_template(serve::ServedModel& m, const std::string& model_path, const std::string& override_file,
                        const std::string& command);

}  // namespace mt::cli
