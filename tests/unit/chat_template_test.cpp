// Chat templates (meshtrain/serve/chat_template/chat_template.h) against jinja2 itself: every case renders
// with ChatTemplate and with tests/support/render_chat_template.py (/usr/bin/python3 with
// python3-jinja2, the environment transformers' apply_chat_template uses) and the two outputs
// must be equal byte for byte. The variables reach the oracle as nlohmann dumps them (sorted
// keys), so dicts iterate in the same order on both sides. Covered: the chat templates of
// well-known models over several conversations, each expression feature, loop variables,
// namespaces, macros, whitespace control, raise_exception and syntax errors.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/serve/chat_template/chat_template.h"

namespace {

using mt::serve::ChatTemplate;
using nlohmann::json;

constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kOracle = "tests/support/render_chat_template.py";

struct Case {
  std::string label;
  std::string tpl;
  json vars = json::object();
};

struct OracleResult {
  bool ok = false;
  std::string text;  // the rendering, or "ExceptionType: message"
};

// Runs `command` with `input` as its stdin (through a temporary file): exit code and stdout.
std::pair<int, std::string> run_with_input(const std::string& command, const std::string& input) {
  char path[] = "/tmp/mt_chat_template_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {-1, "mkstemp failed"};
  size_t written = 0;
  while (written < input.size()) {
    const ssize_t n = write(fd, input.data() + written, input.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  close(fd);
  FILE* p = popen((command + " < " + path).c_str(), "r");
  if (!p) {
    unlink(path);
    return {-1, "popen failed"};
  }
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  unlink(path);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// jinja2's renderings of all cases, in one Python run.
std::vector<OracleResult> oracle(const std::vector<Case>& cases) {
  json request = json::array();
  for (const Case& c : cases) request.push_back({{"template", c.tpl}, {"variables", c.vars}});
  const auto [code, out] = run_with_input(std::string(kPython) + " " + kOracle + " --batch", request.dump());
  if (code != 0) throw std::runtime_error("the jinja2 oracle failed (exit " + std::to_string(code) + "): " + out);
  std::vector<OracleResult> results;
  for (const json& r : json::parse(out))
    results.push_back({r.at("ok").get<bool>(), r.value(r.at("ok").get<bool>() ? "output" : "error", "")});
  return results;
}

int g_compared = 0;

// Every case must render, on both sides, to the same text.
void expect_same_as_jinja(const std::vector<Case>& cases) {
  std::vector<OracleResult> expected;
  ASSERT_NO_THROW(expected = oracle(cases));
  ASSERT_EQ(expected.size(), cases.size());
  int equal = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE(c.label);
    EXPECT_TRUE(expected[k].ok) << "jinja2 failed on " << c.label << ": " << expected[k].text;
    if (!expected[k].ok) continue;
    std::string ours;
    try {
      ours = ChatTemplate(c.tpl).render(c.vars);
    } catch (const mt::Error& e) {
      ADD_FAILURE() << c.label << ": ChatTemplate threw " << e.what() << "\njinja2 rendered:\n" << expected[k].text;
      continue;
    }
    EXPECT_EQ(ours, expected[k].text) << c.label << "\ntemplate:\n" << c.tpl;
    equal += ours == expected[k].text;
  }
  g_compared += static_cast<int>(cases.size());
  std::cout << "[chat_template] " << cases.size() << " cases compared with jinja2, " << equal << " equal\n";
}

// Every case must fail on both sides: jinja2 raises, ChatTemplate throws mt::Error whose
// message contains `needle` (and starts with "[chat_template] ").
void expect_both_fail(const std::vector<std::pair<Case, std::string>>& cases) {
  std::vector<Case> plain;
  for (const auto& [c, needle] : cases) plain.push_back(c);
  std::vector<OracleResult> expected;
  ASSERT_NO_THROW(expected = oracle(plain));
  ASSERT_EQ(expected.size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& [c, needle] = cases[k];
    SCOPED_TRACE(c.label);
    EXPECT_FALSE(expected[k].ok) << "jinja2 rendered " << c.label << " as: " << expected[k].text;
    try {
      const std::string out = ChatTemplate(c.tpl).render(c.vars);
      ADD_FAILURE() << c.label << ": ChatTemplate rendered instead of failing: " << out;
    } catch (const mt::Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("[chat_template] ", 0), 0u) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << c.label << ": '" << what << "' lacks '" << needle << "'";
      std::cout << "[chat_template] " << c.label << ": jinja2 '" << expected[k].text << "', ours '" << what << "'\n";
    }
  }
  g_compared += static_cast<int>(cases.size());
  std::cout << "[chat_template] " << cases.size() << " failing cases compared with jinja2\n";
}

class CountCompared : public ::testing::Environment {
 public:
  void TearDown() override {
    std::cout << "[chat_template] " << g_compared << " cases compared with jinja2 in all\n";
  }
};
[[maybe_unused]] ::testing::Environment* const kCountCompared = ::testing::AddGlobalTestEnvironment(new CountCompared);

// --- conversations ---------------------------------------------------------------------------
json msg(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

json vars_for(json messages, bool add_generation_prompt, const std::string& bos = "<s>", const std::string& eos = "</s>") {
  return {{"messages", std::move(messages)},
          {"add_generation_prompt", add_generation_prompt},
          {"bos_token", bos},
          {"eos_token", eos}};
}

// Alternating user/assistant conversations, with and without a system message, with content
// that has newlines, quotes, spaces to trim, braces and non-ASCII text.
std::vector<std::pair<std::string, json>> conversations(bool with_system) {
  std::vector<std::pair<std::string, json>> out;
  const json sys = msg("system", "You are a helpful assistant.\nAnswer briefly.");
  auto with = [&](json turns) {
    if (!with_system) return turns;
    json all = json::array({sys});
    for (auto& t : turns) all.push_back(t);
    return all;
  };
  out.emplace_back("one user turn", with(json::array({msg("user", "Hello!")})));
  out.emplace_back("multi-turn", with(json::array({msg("user", "What is 2+2?"), msg("assistant", "  4  "),
                                                    msg("user", "And \"3+3\"? It's {{ not }} a template."),
                                                    msg("assistant", "6.\n\nDone."), msg("user", "Thanks")})));
  out.emplace_back("unicode and newlines",
                   with(json::array({msg("user", "  Grüße aus Köln 😀\n\tzweite Zeile  \n"),
                                     msg("assistant", "¡Hola! 你好 — «ok»\r\n"), msg("user", "'single' \\ back")})));
  out.emplace_back("ends with assistant", with(json::array({msg("user", "Hi"), msg("assistant", "Hello, how can I help?")})));
  return out;
}

// The model's template over every conversation, with and without a system message (where the
// template takes one) and with add_generation_prompt on and off.
std::vector<Case> model_cases(const std::string& model, const std::string& tpl, bool system_ok,
                              const std::string& bos = "<s>", const std::string& eos = "</s>") {
  std::vector<Case> cases;
  for (bool with_system : {false, true}) {
    if (with_system && !system_ok) continue;
    for (const auto& [name, messages] : conversations(with_system))
      for (bool gen : {true, false})
        cases.push_back({model + ": " + name + (with_system ? ", system" : "") + (gen ? ", generation prompt" : ""),
                         tpl, vars_for(messages, gen, bos, eos)});
  }
  return cases;
}

}  // namespace

// --- the chat templates of well-known models (tokenizer_config.json "chat_template") ---------
namespace templates {

// meta-llama/Llama-2-7b-chat-hf
const char* const kLlama2Chat =
    R"TPL({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})TPL";

// meta-llama/Meta-Llama-3-8B-Instruct
const char* const kLlama3Instruct =
    R"TPL({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})TPL";

// meta-llama/Llama-3.1-8B-Instruct
const char* const kLlama31Instruct = R"TPL({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)TPL";

// mistralai/Mistral-7B-Instruct-v0.1
const char* const kMistralV01 =
    R"TPL({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})TPL";

// mistralai/Mistral-7B-Instruct-v0.2
const char* const kMistralV02 = R"TPL({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)TPL";

// mistralai/Mistral-7B-Instruct-v0.3
const char* const kMistralV03 = R"TPL({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)TPL";

// Qwen/Qwen2-7B-Instruct
const char* const kQwen2Instruct =
    R"TPL({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful assistant.<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})TPL";

// Qwen/Qwen2.5-7B-Instruct
const char* const kQwen25Instruct = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TPL";

// HuggingFaceH4/zephyr-7b-beta (TinyLlama/TinyLlama-1.1B-Chat-v1.0 ships the same template)
const char* const kZephyr = R"TPL({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})TPL";

// google/gemma-7b-it (gemma-2 instruct models ship the same template)
const char* const kGemmaIt =
    R"TPL({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %})TPL";

// microsoft/Phi-3-mini-4k-instruct
const char* const kPhi3Mini =
    R"TPL({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'user' %}{{'<|user|>
' + message['content'] + '<|end|>
'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>
' + message['content'] + '<|end|>
'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>
' }}{% else %}{{ eos_token }}{% endif %})TPL";

// HuggingFaceTB/SmolLM2-1.7B-Instruct
const char* const kSmolLM2 =
    R"TPL({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})TPL";

// The ChatML template (teknium/OpenHermes-2.5-Mistral-7B and many others)
const char* const kChatML =
    R"TPL({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})TPL";

// deepseek-ai/deepseek-coder-6.7b-instruct
const char* const kDeepSeekCoder = R"TPL({% if not add_generation_prompt is defined %}
{% set add_generation_prompt = false %}
{% endif %}
{%- set ns = namespace(found=false) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'system' -%}
        {%- set ns.found = true -%}
    {%- endif -%}
{%- endfor -%}
{{bos_token}}{%- if not ns.found -%}
{{'You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek Company, and you only answer questions related to computer science. For politically sensitive questions, security and privacy issues, and other non-computer science questions, you will refuse to answer\n'}}
{%- endif %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
{{ message['content'] }}
    {%- else %}
        {%- if message['role'] == 'user' %}
{{'### Instruction:\n' + message['content'] + '\n'}}
        {%- else %}
{{'### Response:\n' + message['content'] + '\n<|EOT|>\n'}}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}
{{'### Response:'}}
{% endif %})TPL";

// CohereForAI/c4ai-command-r-v01 (the default template, without tools or RAG)
const char* const kCommandR =
    R"TPL({{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% elif false == true %}{% set loop_messages = messages %}{% set system_message = 'You are Command-R, a brilliant, sophisticated, AI-assistant trained to assist human users by providing thorough responses. You are trained by Cohere.' %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% if system_message != false %}{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% set content = message['content'] %}{% if message['role'] == 'user' %}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}{% elif message['role'] == 'assistant' %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>'  + content.strip() + '<|END_OF_TURN_TOKEN|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %})TPL";

}  // namespace templates

namespace {

// --- tool use: the tools branches of the templates that have them ----------------------------
json weather_tool() {
  return json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "description": "Get the current weather in a city.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. \"Paris\""},
                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})");
}

json tool_conversation(bool with_ids) {
  json call = {{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Zürich"}, {"unit", "celsius"}}}}}};
  if (with_ids) call["id"] = "abcDEF123";
  json tool_msg = msg("tool", "{\"temperature\": 21.5, \"sky\": \"clear\"}");
  if (with_ids) tool_msg["tool_call_id"] = "abcDEF123";
  json assistant_call = {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}};
  return json::array({msg("user", "What's the weather in Zürich?"), assistant_call, tool_msg,
                      msg("assistant", "It is 21.5 °C and clear."), msg("user", "Thanks!")});
}

}  // namespace

TEST(ChatTemplate, Llama2ChatMatchesJinja) {
  expect_same_as_jinja(model_cases("Llama-2-chat", templates::kLlama2Chat, true));
}

TEST(ChatTemplate, Llama3InstructMatchesJinja) {
  expect_same_as_jinja(model_cases("Llama-3-Instruct", templates::kLlama3Instruct, true, "<|begin_of_text|>", "<|eot_id|>"));
}

TEST(ChatTemplate, Llama31InstructMatchesJinja) {
  std::vector<Case> cases =
      model_cases("Llama-3.1-Instruct", templates::kLlama31Instruct, true, "<|begin_of_text|>", "<|eot_id|>");
  json tools = vars_for(tool_conversation(false), true, "<|begin_of_text|>", "<|eot_id|>");
  tools["tools"] = json::array({weather_tool()});
  cases.push_back({"Llama-3.1-Instruct: tools in the user message", templates::kLlama31Instruct, tools});
  tools["tools_in_user_message"] = false;
  tools["date_string"] = "01 Jan 2025";
  cases.push_back({"Llama-3.1-Instruct: tools in the system message", templates::kLlama31Instruct, tools});
  json builtin = vars_for(json::array({msg("system", "Use tools."), msg("user", "Search for llamas")}), true,
                          "<|begin_of_text|>", "<|eot_id|>");
  builtin["builtin_tools"] = json::array({"brave_search", "code_interpreter", "wolfram_alpha"});
  builtin["messages"].push_back(
      {{"role", "assistant"},
       {"tool_calls", json::array({{{"function", {{"name", "brave_search"}, {"arguments", {{"query", "llama facts"}}}}}}})}});
  builtin["messages"].push_back(msg("ipython", "Llamas are camelids."));
  cases.push_back({"Llama-3.1-Instruct: builtin tools", templates::kLlama31Instruct, builtin});
  expect_same_as_jinja(cases);
}

TEST(ChatTemplate, MistralInstructMatchesJinja) {
  std::vector<Case> cases = model_cases("Mistral-7B-Instruct-v0.1", templates::kMistralV01, false);
  for (Case& c : model_cases("Mistral-7B-Instruct-v0.2", templates::kMistralV02, true)) cases.push_back(std::move(c));
  for (Case& c : model_cases("Mistral-7B-Instruct-v0.3", templates::kMistralV03, true)) cases.push_back(std::move(c));
  json tools = vars_for(tool_conversation(true), false);
  tools["tools"] = json::array({weather_tool()});
  cases.push_back({"Mistral-7B-Instruct-v0.3: tools", templates::kMistralV03, tools});
  tools["messages"].insert(tools["messages"].begin(), msg("system", "You can call tools."));
  cases.push_back({"Mistral-7B-Instruct-v0.3: tools and system", templates::kMistralV03, tools});
  expect_same_as_jinja(cases);
}

TEST(ChatTemplate, QwenInstructMatchesJinja) {
  std::vector<Case> cases = model_cases("Qwen2-Instruct", templates::kQwen2Instruct, true, "", "<|im_end|>");
  for (Case& c : model_cases("Qwen2.5-Instruct", templates::kQwen25Instruct, true, "", "<|im_end|>")) {
    c.vars["bos_token"] = nullptr;  // Qwen has no BOS token
    cases.push_back(std::move(c));
  }
  json tools = vars_for(tool_conversation(false), true, "", "<|im_end|>");
  tools["tools"] = json::array({weather_tool()});
  cases.push_back({"Qwen2.5-Instruct: tools", templates::kQwen25Instruct, tools});
  tools["messages"].insert(tools["messages"].begin(), msg("system", "Custom system prompt."));
  tools["messages"][3] = msg("tool", "first result");  // two tool results in a row
  tools["messages"].insert(tools["messages"].begin() + 4, msg("tool", "second result"));
  cases.push_back({"Qwen2.5-Instruct: tools, system, two tool results", templates::kQwen25Instruct, tools});
  expect_same_as_jinja(cases);
}

TEST(ChatTemplate, ZephyrAndTinyLlamaMatchJinja) { expect_same_as_jinja(model_cases("Zephyr", templates::kZephyr, true)); }

TEST(ChatTemplate, GemmaItMatchesJinja) {
  expect_same_as_jinja(model_cases("Gemma-it", templates::kGemmaIt, false, "<bos>", "<eos>"));
}

TEST(ChatTemplate, Phi3MatchesJinja) {
  expect_same_as_jinja(model_cases("Phi-3-mini", templates::kPhi3Mini, true, "<s>", "<|endoftext|>"));
}

TEST(ChatTemplate, SmolLM2AndChatMLMatchJinja) {
  std::vector<Case> cases = model_cases("SmolLM2", templates::kSmolLM2, true, "<|im_start|>", "<|im_end|>");
  for (Case& c : model_cases("ChatML", templates::kChatML, true, "", "<|im_end|>")) cases.push_back(std::move(c));
  expect_same_as_jinja(cases);
}

TEST(ChatTemplate, DeepSeekCoderAndCommandRMatchJinja) {
  std::vector<Case> cases = model_cases("DeepSeek-Coder-instruct", templates::kDeepSeekCoder, true, "<｜begin▁of▁sentence｜>", "<|EOT|>");
  Case no_flag = cases.front();
  no_flag.label += ", add_generation_prompt not given";
  no_flag.vars.erase("add_generation_prompt");
  cases.push_back(no_flag);
  for (Case& c : model_cases("Command-R", templates::kCommandR, true, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"))
    cases.push_back(std::move(c));
  expect_same_as_jinja(cases);
}

TEST(ChatTemplate, RaiseExceptionInModelTemplatesMatchesJinja) {
  const json system_first = vars_for(json::array({msg("system", "sys"), msg("user", "hi")}), true);
  const json two_users = vars_for(json::array({msg("user", "a"), msg("user", "b")}), true);
  expect_both_fail({
      {{"Gemma-it: system role", templates::kGemmaIt, system_first}, "System role not supported"},
      {{"Gemma-it: roles not alternating", templates::kGemmaIt, two_users}, "Conversation roles must alternate"},
      {{"Llama-2-chat: roles not alternating", templates::kLlama2Chat, two_users}, "Conversation roles must alternate"},
      {{"Mistral-v0.1: system role", templates::kMistralV01, system_first}, "Conversation roles must alternate"},
      {{"Mistral-v0.3: roles not alternating", templates::kMistralV03, two_users}, "After the optional system message"},
  });
  // The message is exactly "[chat_template] " + the template's text.
  try {
    ChatTemplate(templates::kGemmaIt).render(system_first);
    ADD_FAILURE() << "expected mt::Error";
  } catch (const mt::Error& e) {
    EXPECT_STREQ(e.what(), "[chat_template] System role not supported");
  }
}

// --- the Jinja subset, feature by feature -----------------------------------------------------
namespace {

const json kVars = json::parse(R"({
  "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \"you\"\n it's me, ü 😀"},
               {"role": "assistant", "content": "  Hello!  "}],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
  "n": 7, "f": 2.5, "neg": -3, "t": true, "nothing": null, "empty": "", "words": ["b", "A", "a", "c"],
  "d": {"b": 1, "a": [1, 2.5, "x", null, true]}, "nested": {"x": {"y": [10, 20, 30]}}
})");

std::vector<Case> cases_of(const std::vector<std::string>& tpls, const json& vars = kVars) {
  std::vector<Case> out;
  for (const auto& t : tpls) out.push_back({t, t, vars});
  return out;
}

}  // namespace

TEST(ChatTemplate, LiteralsAndOutputMatchJinja) {
  expect_same_as_jinja(cases_of({
      "plain text only, no tags",
      "{{ 'single' }}{{ \"double\" }}{{ 'a' 'b' }}{{ \"it's\" }}{{ 'say \"hi\"' }}",
      "{{ '\\x41\\u00e9\\U0001F600\\n\\t\\\\\\'\\\"\\101\\q' }}",
      "{{ 1 }} {{ -1 }} {{ 1_000 }} {{ 0x1f }} {{ 0o17 }} {{ 0b101 }} {{ 1.5 }} {{ 1.5e3 }} {{ 2E-2 }} {{ 1e16 }} {{ 1e-5 }}",
      "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 3.0 }} {{ -0.0 }} {{ 12345678901234567.0 }} {{ 1e300 * 1e10 }} {{ 2 ** 62 }} {{ 100.0 }}",
      "{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }}",
      "{{ [1, 'a', (1,), {'k': none}, 1.5e20, \"it's\", [], {}] }} {{ (1, 2) }} {{ () }} {{ ('x',) }}",
      "{{ {'b': 1, 'a': 2, 3: 'x', true: none} }}",
      "{{ nothing }}|{{ undefined_name }}|{{ t }}|{{ f }}|{{ d }}|{{ words }}|{{ 'é\\x7f\\x00\\u200b' ~ ['é\\x7f\\x00\\u200b\\xad'] }}",
      "{{ 'a', 'b' }}{{ 1, }}",
      "{{ messages[1] }}",
  }));
}

TEST(ChatTemplate, OperatorsMatchJinja) {
  expect_same_as_jinja(cases_of({
      "{{ 1 + 2 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }}",
      "{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1.5 * 2 }} {{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }}",
      "{{ True + 1 }} {{ 'ab' + 'cd' }} {{ [1] + [2, 3] }} {{ (1,) + (2,) }} {{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [0] * 3 }} {{ 'x' * 0 }}",
      "{{ 'a' ~ 1 ~ none ~ 2.0 ~ true ~ [1] ~ undefined_name }} {{ n ~ f }}",
      "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 10 - 2 - 3 }} {{ 2 * 3 ~ 4 }} {{ 1 ~ 1 + 1 ~ 1 }} {{ -n }} {{ +f }} {{ - - 3 }}",
      "{{ 1 == 1.0 }} {{ True == 1 }} {{ 'a' == 'a' }} {{ [1, 2] == [1, 2] }} {{ [1, 2] == (1, 2) }} {{ {'a': 1} == {'a': 1} }} {{ none == none }} {{ 1 != 2 }}",
      "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1.5 >= 1 }}",
      "{{ 'a' in 'cat' }} {{ 'z' in ['a'] }} {{ 'a' in {'a': 1} }} {{ 1 not in [1, 2] }} {{ 'x' not in 'abc' }} {{ 'role' in messages[0] }} {{ 'x' in undefined_name }}",
      "{{ true and 'x' }} {{ 0 and 'x' }} {{ '' or 'fallback' }} {{ none or 0 }} {{ [] or {} }} {{ not 1 }} {{ not '' }} {{ not 1 == 2 }} {{ not (1 and 0) }}",
      "{{ 'yes' if t else 'no' }} {{ 'yes' if nothing else 'no' }} {{ 1 if 0 else 2 if 0 else 3 }} [{{ 'x' if false }}] {{ ('x' if false) is defined }}",
      "{{ words[0] }} {{ words[-1] }} {{ words[1:] }} {{ words[:-1] }} {{ words[::-1] }} {{ words[1:3] }} {{ words[::2] }} {{ words[10:] }} {{ words[-2:] }}",
      "{{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ 'héllo'[-3:] }} {{ (1, 2, 3)[1:] }} {{ [1, 2][5] }}|{{ 'ab'[9] }}|",
      "{{ messages[0].role }} {{ messages[0]['content'] }} {{ nested.x.y[1] }} {{ nested['x']['y'][-1] }} {{ nested.x.y.0 }} {{ d.b }} {{ d['a'][2] }}",
      "{{ d.missing }}|{{ d.missing is defined }}|{{ nothing.x }}|{{ n.real }} {{ n.imag }} {{ f.real }}|{{ messages[0].items is defined }}",
  }));
}

TEST(ChatTemplate, TestsMatchJinja) {
  expect_same_as_jinja(cases_of({
      "{{ n is defined }} {{ missing is defined }} {{ missing is not defined }} {{ missing is undefined }} {{ d.a is defined }} {{ d.zz is defined }}",
      "{{ nothing is none }} {{ n is not none }} {{ 'a' is string }} {{ n is string }} {{ n is number }} {{ f is number }} {{ t is number }}",
      "{{ n is integer }} {{ f is integer }} {{ t is integer }} {{ f is float }} {{ t is boolean }} {{ 1 is boolean }} {{ t is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}",
      "{{ d is mapping }} {{ words is mapping }} {{ words is iterable }} {{ 'x' is iterable }} {{ n is iterable }} {{ missing is iterable }} {{ d is iterable }}",
      "{{ words is sequence }} {{ 'x' is sequence }} {{ d is sequence }} {{ n is sequence }} {{ missing is sequence }}",
      "{{ n is odd }} {{ n is even }} {{ 10 is divisibleby 5 }} {{ 10 is divisibleby(3) }} {{ 'a' is equalto 'a' }} {{ 1 is eq 2 }} {{ 1 is ne 2 }}",
      "{{ 3 is gt 2 }} {{ 3 is lt 2 }} {{ 3 is ge 3 }} {{ 3 is le 2 }} {{ 3 is greaterthan 1 }} {{ 3 is lessthan 1 }} {{ 'a' is in 'cat' }} {{ 5 is in [1, 2] }}",
      "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '1A' is upper }} {{ none is sameas none }} {{ t is sameas true }} {{ ('x'|e) is escaped }} {{ 'x' is escaped }}",
      "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ range is callable }} {{ n is callable }}",
      "{% if messages[0].content is string and messages|length > 1 %}ok{% endif %}{% if missing is defined or n %}ok2{% endif %}",
  }));
}

TEST(ChatTemplate, FiltersMatchJinja) {
  expect_same_as_jinja(cases_of({
      "[{{ '  x y  '|trim }}] [{{ 'xxaxx'|trim('x') }}] {{ 'abc'|upper }} {{ 'ÄBC'|lower }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello big-world (x) [y'|title }}",
      "{{ 'abc'|length }} {{ 'héllo'|length }} {{ words|length }} {{ d|length }} {{ missing|length }} {{ words|count }}",
      "{{ missing|default('dflt') }} {{ missing|d('d2') }} {{ n|default(0) }} {{ ''|default('e') }} {{ ''|default('e', true) }} {{ nothing|default('x') }} {{ missing|default }}|",
      "{{ words|first }} {{ words|last }} {{ 'abc'|first }} {{ 'abc'|last }} {{ []|first }}| {{ d|first }}",
      "{{ words|join }} {{ words|join(', ') }} {{ [1, 'a', none]|join('-') }} {{ messages|join(attribute='role') }} {{ messages|map(attribute='role')|join('/') }}",
      "{{ '42'|int }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ '0x1A'|int(0, 16) }} {{ t|int }} {{ nothing|int }}",
      "{{ '2.5'|float }} {{ 3|float }} {{ 'x'|float }} {{ '1e3'|float }} {{ n|string }} {{ nothing|string }} {{ t|string + '!' }} {{ words|string }}",
      "{{ 'a\"b'|tojson }} {{ d|tojson }} {{ d|tojson(indent=2) }} {{ words|tojson(indent='\\t') }} {{ d|tojson(sort_keys=true) }} {{ [1, 2]|tojson(separators=(',', ':')) }}",
      "{{ 'é😀\\n\\x01'|tojson }} {{ 'é😀'|tojson(ensure_ascii=true) }} {{ {1: 2, true: 3, none: 4, 1.5: 5}|tojson }} {{ 1e20|tojson }} {{ messages|tojson }} {{ []|tojson(indent=2) }} {{ (1, 'x')|tojson }}",
      "{{ words|list }} {{ 'abc'|list }} {{ d|list }} {{ d|items|list }} {{ missing|list }} {{ (1, 2)|list }}",
      "{{ words|sort }} {{ words|sort(reverse=true) }} {{ words|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort }} {{ messages|sort(attribute='role')|map(attribute='role')|list }}",
      "{{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ [1, 1, 2, 1]|unique|list }} {{ words|reverse|list }} {{ 'abc'|reverse }}",
      "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'in', ['system'])|map(attribute='role')|list }} {{ messages|selectattr('role')|list|length }}",
      "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} {{ [0, 1, '', none, 'x']|select|list }} {{ [1, 5, 9]|select('gt', 3)|list }}",
      "{{ words|map('upper')|list }} {{ [{'a': {'b': 1}}, {'a': {'b': 2}}]|map(attribute='a.b')|list }} {{ [{'a': 1}, {}]|map(attribute='a', default='z')|list }} {{ [[1, 2], [3]]|map(attribute=0)|list }}",
      "{{ 'hello'|replace('l', 'L') }} {{ 'aXbX'|replace('X', '', 1) }} {{ 'abc'|replace('', '-') }} {{ '<a href=\"x\">&\\'</a>'|e }} {{ '<'|escape }} {{ '<b>'|safe }}",
      "{{ ('<'|e) + '<' }} {{ ('<b>'|safe) ~ '<' }} {{ '<'|e|e }} {{ '<'|forceescape }} {{ '<'|e|length }}",
      "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}",
      "{{ 'one two  three'|wordcount }} {{ 'abc'|center(9) }}|{{ '%s-%d'|format('a', 3) }} {{ '%(a)s!'|format(a='x') }} {{ 'x %s y' % 5 }} {{ '%5.2f|%-4s|%03d|%x|%r' % (3.14159, 'ab', 7, 255, 'q') }}",
      "{{ 3.7|round }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3|round }} {{ 3.14159|round(2, 'floor') }} {{ 3.14159|round(1, 'ceil') }} {{ -3|abs }} {{ -2.5|abs }}",
      "{{ [1, 2, 3]|sum }} {{ [[1], [2, 3]]|sum(start=[]) }} {{ messages|sum(attribute='role', start=[]) if false else 0 }} {{ [4, 2, 9]|max }} {{ [4, 2, 9]|min }} {{ words|max }} {{ words|min }}",
      "{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 0)|list }} {{ 'long text here'|truncate(9) }} {{ 'long text here'|truncate(9, true) }}",
      "{{ messages[0]|attr('role') }}|{{ 'abc'|attr('upper')() }}",
      "{% set x | upper %}block {{ 'text' }}{% endset %}{{ x }}{% filter trim %}   padded   {% endfilter %}|",
  }));
}

TEST(ChatTemplate, StringAndDictMethodsMatchJinja) {
  expect_same_as_jinja(cases_of({
      "[{{ '  x  '.strip() }}] [{{ '  x  '.lstrip() }}] [{{ '  x  '.rstrip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '\\n\\t x \\u3000'.strip() }}] [{{ messages[2].content.strip() }}]",
      "{{ 'Hello'.startswith('He') }} {{ 'Hello'.startswith(('x', 'H')) }} {{ 'Hello'.endswith('lo') }} {{ 'Hello'.endswith('x') }}",
      "{{ 'a,b,,c'.split(',') }} {{ ' a  b \\n c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ 'ab\\ncd\\r\\ne'.splitlines() }}",
      "{{ 'ab'.upper() }} {{ 'ÀB'.lower() }} {{ 'hello wORLD it\\'s'.title() }} {{ 'hELLO'.capitalize() }} {{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 2) }}",
      "{{ 'abc'.find('c') }} {{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ 'abcabc'.count('bc') }} {{ '-'.join(['a', 'b']) }} {{ ''.join(words) }}",
      "{{ 'a{}b{}'.format(1, 'x') }} {{ '{0}{0}'.format(2) }} {{ '{n}!'.format(n=3) }} {{ '12'.isdigit() }} {{ 'x1'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'AB'.isupper() }}",
      "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }}",
      "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}{% for k, v in d|dictsort %}{{ k }}{% endfor %}",
      "{{ {'items': 3}['items'] }} {{ {'content': 1}.content }} {{ {'a': 1}['b'] is defined }}",
  }));
}

TEST(ChatTemplate, LoopsMatchJinja) {
  expect_same_as_jinja(cases_of({
      "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }};{% endfor %}",
      "{% for x in words %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}{{ loop.cycle('o', 'e') }} {% endfor %}",
      "{% for x in [1, 2, 3, 4, 5, 6] if x is even %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% endfor %}",
      "{% for m in messages if m.role != 'system' %}{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
      "{% for x in [] %}never{% else %}empty{% endfor %}{% for x in missing %}never{% else %}undefined is empty{% endfor %}{% for x in [1] %}{{ x }}{% else %}no{% endfor %}",
      "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}{% for (a, b) in [(5, 6)] %}{{ a + b }}{% endfor %}{% for c in 'hé' %}{{ c }}.{% endfor %}",
      "{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
      "{% for a in [1, 2, 3] %}{% for b in [1, 2] %}{% if b == 2 %}{% break %}{% endif %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}|{{ loop.index }}{% endfor %}",
      "{% for m in [1, 2] %}{% for n in [] %}{% else %}{% if m == 1 %}{% continue %}{% endif %}e{{ m }}{% endfor %}after{{ m }}{% endfor %}",
      "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|join(',') }} {{ range(0)|list }}",
      "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}",
      "{% for i in [1, 2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]",
      "{{ loop }}|{% for i in [1] %}{{ i }}{% endfor %}{{ i }}|",
      "{% for x in [1, 2, 3] %}{% set z %}{% if x == 2 %}{% continue %}{% endif %}<{{ x }}>{% endset %}[{{ z }}]{% endfor %}",
      "{% for x in [1, 2, 3] %}{% filter upper %}a{% if x == 2 %}{% break %}{% endif %}{% endfilter %}{{ x }}{% endfor %}",
  }));
}

TEST(ChatTemplate, SetAndNamespaceMatchJinja) {
  expect_same_as_jinja(cases_of({
      "{% set x = 5 %}{{ x }}{% set x = x * 2 %}{{ x }}{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}",
      "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}{% for i in [1] %}{% set x = 3 %}{{ x }}{% endfor %}{{ x }}",
      "{% set ns = namespace(found=false, count=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.found }} {{ ns.count }}",
      "{% set ns = namespace() %}{% set ns.items = [] %}{% for w in words %}{% set ns.items = ns.items + [w|upper] %}{% endfor %}{{ ns.items }}{{ ns.missing }}{{ ns.missing is defined }}",
      "{% set ns = namespace(d) %}{{ ns.b }}{{ ns }}",
      "{% set block %}  a {{ 1 + 1 }}\n{% endset %}[{{ block }}]",
      "{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]",
      "{% set messages = messages[1:] %}{{ messages|length }}{% set dct = dict(a=1, b=[2]) %}{{ dct }}",
  }));
}

TEST(ChatTemplate, MacrosMatchJinja) {
  expect_same_as_jinja(cases_of({
      "{% macro m(a, b='x') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=5, a=4) }}{{ m() }}",
      "{% macro v(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, 3) }}",
      "{% macro render(message) -%}\n<{{ message.role }}>{{ message.content|trim }}</{{ message.role }}>\n{%- endmacro %}\n{% for m in messages %}{{ render(m) }}\n{% endfor %}",
      "{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}",
      "{% macro sees_globals() %}{{ bos_token }}{{ later }}{% endmacro %}{% set later = 'L' %}{{ sees_globals() }}",
      "{% macro m() %}x{% endmacro %}{{ m() ~ m() }}{{ m()|upper }}{{ m }}",
  }));
}

TEST(ChatTemplate, RawCommentsAndWhitespaceControlMatchJinja) {
  expect_same_as_jinja(cases_of({
      "a\n  {% if true %}\n    x\n  {% endif %}\nb\n",
      "a\n  {%- if true -%}\n    x\n  {%+ endif %}  \nb",
      "{% raw %}\n {{ x }} {% if %}{% endraw %}\n-{%- raw -%}  r  {%- endraw %}|",
      "{# comment #}\n  {# indented comment #}  \nx {{- ' y ' -}}  z\n{#- strip before #} w {#- x -#} v",
      "x\n\n  {% for i in [1, 2] %}\n  - {{ i }}\n  {% endfor %}\n\ny\n\n",
      "  {{ 'a' }}\n  {% if true %}b{% endif %}   \n  {#x#}  c\n",
      "line1\r\nline2\r  {% if true %}\r\n  x\r\n  {% endif %}\r\nend\r\n",
      "{% if true %}  \n{% endif %}|{% if true +%}\n{% endif %}|{%+ if true %}x{% endif %}",
      "\t{% if true %}tab\n\t{% endif %}\n \t {%- if true %}y{% endif %}",
      "a {% if true %}inline{% endif %} b\n  {{ 'var not lstripped' }}\n",
      "{%- set x = 1 -%}\n\n  {{- x -}}\n\n  {%- if x -%}  yes  {%- endif -%}  \n",
  }));
  // Every combination of text around one tag: whitespace control on either side, trim_blocks
  // and lstrip_blocks.
  std::vector<Case> combos;
  const std::vector<std::string> before = {"a", "a\n", "a\n  ", "a \t", "\n  ", "\u00a0\n \t", ""};
  const std::vector<std::string> after = {"b", "\nb", "  \nb", "\n\nb", " \n", "\r\n  b", ""};
  const std::vector<std::string> left = {"", "-", "+"}, right = {"", "-", "+"};
  for (const auto& b : before)
    for (const auto& a : after)
      for (const auto& l : left)
        for (const auto& r : right) {
          const std::string var_r = r == "+" ? "" : r;
          const std::vector<std::string> tags = {
              "{%" + l + " if true " + r + "%}",
              "{%" + l + " if true " + r + "%}\n  T  \n{%" + l + " endif " + r + "%}",
              "{#" + l + " c " + r + "#}",
              "{{" + (l == "+" ? "" : l) + " 'v' " + var_r + "}}",
              "{%" + l + " raw " + (r == "+" ? "" : r) + "%}\n R \n{%" + l + " endraw " + r + "%}",
          };
          for (size_t k = 0; k < tags.size(); ++k) {
            std::string t = b + tags[k] + a;
            if (k == 0) t += "{% endif %}";
            combos.push_back({t, t, json::object()});
          }
        }
  expect_same_as_jinja(combos);
}

TEST(ChatTemplate, SyntaxErrorsNameTheLine) {
  const json none = json::object();
  expect_both_fail({
      {{"unclosed if", "a\n{% if x %}\nb", none}, "line 2"},
      {{"unclosed for", "{% for m in messages %}{{ m }}", none}, "'for' block opened at line 1"},
      {{"unclosed macro", "\n\n{% macro m() %}x", none}, "line 3"},
      {{"bad expression", "x\n{{ 1 + }}", none}, "line 2, column"},
      {{"missing operand in if", "{% if %}x{% endif %}", none}, "line 1"},
      {{"unknown filter", "{{ x|nosuchfilter }}", none}, "no filter named 'nosuchfilter'"},
      {{"unknown test", "\n{{ x is nosuchtest }}", none}, "line 2"},
      {{"unknown tag", "{% frobnicate %}", none}, "unknown tag 'frobnicate'"},
      {{"stray endif", "{% endif %}", none}, "'endif'"},
      {{"unterminated string", "{{ 'abc }}", none}, "line 1"},
      {{"unbalanced bracket", "{{ (1, }}", none}, "unexpected '}'"},
      {{"unclosed print", "{{ 1 ", none}, "line 1"},
      {{"unclosed comment", "{# comment", none}, "comment"},
      {{"unclosed raw", "{% raw %}x", none}, "raw"},
      {{"break outside a loop", "{% if true %}{% break %}{% endif %}", none}, "outside of a loop"},
      {{"for without in", "{% for x messages %}{% endfor %}", none}, "expected 'in'"},
  });
  // Syntax errors surface when the template is constructed, not when it renders.
  EXPECT_THROW(ChatTemplate("{% if true %}"), mt::Error);
  // Recursive loops are outside the supported subset (jinja2 has them): refused, not misrendered.
  EXPECT_THROW(ChatTemplate("{% for x in xs recursive %}{{ loop(x) }}{% endfor %}"), mt::Error);
}

TEST(ChatTemplate, RuntimeErrorsMatchJinja) {
  expect_both_fail({
      {{"raise_exception", "a{{ raise_exception('bad role: ' ~ messages[0].role) }}", kVars}, "[chat_template] bad role: system"},
      {{"attribute of undefined", "{{ missing.attr }}", kVars}, "'missing' is undefined"},
      {{"arithmetic on undefined", "\n{{ missing + 1 }}", kVars}, "line 2"},
      {{"division by zero", "{{ 1 / 0 }}", kVars}, "division by zero"},
      {{"str + int", "{{ 'a' + 1 }}", kVars}, "TypeError"},
      {{"ordering str and int", "{{ [1] < 'a' }}", kVars}, "not supported"},
      {{"mutating a list (sandbox)", "{{ words.append('x') }}", kVars}, "unsafe"},
      {{"calling undefined", "{{ nosuchfunction() }}", kVars}, "'nosuchfunction' is undefined"},
      {{"tojson of undefined", "{{ missing|tojson }}", kVars}, "not JSON serializable"},
      {{"namespace attribute on a non-namespace", "{% set x = 1 %}{% set x.a = 2 %}", kVars}, "non-namespace"},
      {{"unpacking a non-pair", "{% for a, b in [1] %}{% endfor %}", kVars}, "line 1"},
  });
  // Python's ints are unbounded, ours 64-bit: a result outside that range is an error, never a
  // wrapped value (jinja2 would print the big number).
  EXPECT_THROW(ChatTemplate("{{ 2 ** 100 }}").render(kVars), mt::Error);
  EXPECT_THROW(ChatTemplate("{{ 9223372036854775807 + n }}").render(kVars), mt::Error);
  EXPECT_EQ(ChatTemplate("{{ 2 ** 62 }}").render(kVars), "4611686018427387904");
  try {
    ChatTemplate("{{ raise_exception('Only user and assistant roles are supported!') }}").render(kVars);
    ADD_FAILURE() << "expected mt::Error";
  } catch (const mt::Error& e) {
    EXPECT_STREQ(e.what(), "[chat_template] Only user and assistant roles are supported!");
  }
}

TEST(ChatTemplate, OracleScriptSingleModeRaises) {
  // The oracle's one-request mode: the rendering on stdout, or exit 3 with the message.
  const json ok = {{"template", "{{ bos_token }}{{ messages[0].content }}"}, {"variables", kVars}};
  const auto [code, out] = run_with_input(std::string(kPython) + " " + kOracle, ok.dump());
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, ChatTemplate(ok["template"].get<std::string>()).render(kVars));
  const json bad = {{"template", "{{ raise_exception('nope') }}"}, {"variables", json::object()}};
  const auto [bad_code, bad_out] = run_with_input(std::string(kPython) + " " + kOracle, bad.dump());
  EXPECT_EQ(bad_code, 3);
  EXPECT_NE(bad_out.find("nope"), std::string::npos) << bad_out;
  g_compared += 2;
}

TEST(ChatTemplate, ParsedOnceRendersConcurrently) {
  const ChatTemplate tpl(templates::kLlama31Instruct);
  EXPECT_EQ(tpl.source(), templates::kLlama31Instruct);
  const json vars = vars_for(conversations(true)[1].second, true, "<|begin_of_text|>", "<|eot_id|>");
  const std::string expected = tpl.render(vars);
  std::vector<std::string> got(4);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < got.size(); ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) got[k] = tpl.render(vars);
    });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
  // Variables may be null (no variables) and must otherwise be an object.
  EXPECT_EQ(ChatTemplate("x{{ y }}").render(nullptr), "x");
  EXPECT_THROW(ChatTemplate("x").render(json::array()), mt::Error);
}
