#include "meshtrain/serve/openai_protocol.h"

#include "meshtrain/serve/chat_template/chat_template.h"

#include <cmath>
#include <random>

namespace mt::serve {

using nlohmann::json;

json ApiError::body() const {
  json e = {{"message", what()}, {"type", type_}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) e["param"] = param_;
  if (!code_.empty()) e["code"] = code_;
  return json{{"error", e}};
}

ApiError invalid_request(const std::string& message, const std::string& param) {
  return ApiError(400, "invalid_request_error", message, param);
}

namespace {

const char* type_name(const json& v) {
  return v.is_null() ? "null" : v.is_boolean() ? "boolean" : v.is_number() ? "number" : v.is_string() ? "string"
       : v.is_array() ? "array" : "object";
}

// Optional typed fields: absent and null both mean "the default".
bool present(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

double number_field(const json& body, const char* key, double fallback, double lo, double hi) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_number()) throw invalid_request(detail::concat("'", key, "' must be a number, got ", type_name(v)), key);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    throw invalid_request(detail::concat("'", key, "' must be in [", lo, ", ", hi, "], got ", x), key);
  return x;
}

int64_t int_field(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_number_integer())
    throw invalid_request(detail::concat("'", key, "' must be an integer, got ", type_name(v)), key);
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) throw invalid_request(detail::concat("'", key, "' must be in [", lo, ", ", hi, "], got ", x), key);
  return x;
}

bool bool_field(const json& body, const char* key, bool fallback) {
  if (!present(body, key)) return fallback;
  if (!body[key].is_boolean())
    throw invalid_request(detail::concat("'", key, "' must be a boolean, got ", type_name(body[key])), key);
  return body[key].get<bool>();
}

void check_model(const json& body, const ServedModel& model) {
  if (!present(body, "model")) return;  // as vLLM: the one model served
  if (!body["model"].is_string())
    throw invalid_request(detail::concat("'model' must be a string, got ", type_name(body["model"])), "model");
  const std::string name = body["model"].get<std::string>();
  if (name != model.name)
    throw ApiError(404, "invalid_request_error",
                   detail::concat("The model '", name, "' does not exist: this server serves '", model.name, "'"),
                   "model", "model_not_found");
}

// Fields meshtrain does not implement are refused when set to anything but their neutral
// value, rather than silently ignored.
void refuse_unsupported(const json& body) {
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (present(body, key) && !(body[key].is_number() && body[key].get<double>() == 0))
      throw invalid_request(detail::concat("'", key, "' is not supported by meshtrain serve (only 0)"), key);
  if (present(body, "logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    throw invalid_request("'logit_bias' is not supported by meshtrain serve", "logit_bias");
  if (present(body, "suffix") && !(body["suffix"].is_string() && body["suffix"].get<std::string>().empty()))
    throw invalid_request("'suffix' is not supported by meshtrain serve", "suffix");
  if (present(body, "tools") && !(body["tools"].is_array() && body["tools"].empty()))
    throw invalid_request("'tools' are not supported by meshtrain serve", "tools");
  if (present(body, "response_format")) {
    const json& f = body["response_format"];
    if (!(f.is_object() && f.value("type", "") == "text"))
      throw invalid_request("'response_format' other than {\"type\": \"text\"} is not supported", "response_format");
  }
}

std::vector<std::string> parse_stop(const json& body) {
  std::vector<std::string> stop;
  if (!present(body, "stop")) return stop;
  const json& v = body["stop"];
  if (v.is_string()) {
    stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& s : v) {
      if (!s.is_string()) throw invalid_request("'stop' must be a string or a list of strings", "stop");
      stop.push_back(s.get<std::string>());
    }
  } else {
    throw invalid_request(detail::concat("'stop' must be a string or a list of strings, got ", type_name(v)), "stop");
  }
  if (stop.size() > 4) throw invalid_request(detail::concat("'stop' takes at most 4 sequences, got ", stop.size()), "stop");
  return stop;
}

std::vector<int64_t> encode(const ServedModel& model, const std::string& text, bool add_special_tokens) {
  tokenizers::Encoding e = model.tokenizer->encode(text, add_special_tokens);
  return std::vector<int64_t>(e.ids.begin(), e.ids.end());
}

void check_prompt_length(const ServedModel& model, const std::vector<int64_t>& prompt, const char* param) {
  if (prompt.empty()) throw invalid_request("the prompt encodes to no tokens", param);
  if (int64_t(prompt.size()) > model.max_prompt_tokens)
    throw ApiError(400, "invalid_request_error",
                   detail::concat("the prompt has ", prompt.size(), " tokens; this server takes at most ",
                                  model.max_prompt_tokens, " (--max-prompt-tokens)"),
                   param, "context_length_exceeded");
}

// The sampling fields both APIs share; `max_tokens` is already resolved.
void parse_sampling(const json& body, ParsedRequest& r, int64_t max_tokens) {
  SamplingParams& s = r.engine.sampling;
  s.max_tokens = max_tokens;
  s.temperature = number_field(body, "temperature", 1.0, 0.0, 2.0);
  s.top_p = number_field(body, "top_p", 1.0, 0.0, 1.0);
  if (s.top_p == 0) throw invalid_request("'top_p' must be > 0", "top_p");
  // top_k is vLLM's extension; -1 and 0 both mean every token.
  s.top_k = std::max<int64_t>(0, int_field(body, "top_k", 0, -1, INT64_MAX));
  s.ignore_eos = bool_field(body, "ignore_eos", false);
  if (present(body, "seed")) {
    s.seed = uint64_t(int_field(body, "seed", 0, INT64_MIN, INT64_MAX));
  } else {
    static thread_local std::mt19937_64 fresh{std::random_device{}()};
    s.seed = fresh();
  }
  r.engine.n = int_field(body, "n", 1, 1, 128);
  if (present(body, "best_of") && int_field(body, "best_of", 1, 1, 128) != r.engine.n)
    throw invalid_request("'best_of' other than n is not supported by meshtrain serve", "best_of");
  r.stop = parse_stop(body);
  r.stream = bool_field(body, "stream", false);
  if (present(body, "stream_options")) {
    const json& o = body["stream_options"];
    if (!o.is_object()) throw invalid_request("'stream_options' must be an object", "stream_options");
    if (!r.stream) throw invalid_request("'stream_options' is only allowed with stream: true", "stream_options");
    r.include_usage = bool_field(o, "include_usage", false);
  }
}

int64_t resolve_max_tokens(const json& body, const ServedModel& model, const std::vector<std::vector<int64_t>>& prompts,
                           std::optional<int64_t> fallback) {
  for (const char* key : {"max_completion_tokens", "max_tokens"})
    if (present(body, key)) return int_field(body, key, 16, 1, model.max_tokens_limit);
  if (fallback) return *fallback;
  // Chat without a limit: what the context leaves after the longest prompt.
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  return std::max<int64_t>(1, std::min(model.max_tokens_limit, model.max_model_len - int64_t(longest)));
}

}  // namespace

ParsedRequest parse_completion_request(const json& body, const ServedModel& model) {
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  check_model(body, model);
  refuse_unsupported(body);
  ParsedRequest r;
  r.api = Api::completions;
  if (!present(body, "prompt")) throw invalid_request("'prompt' is required", "prompt");
  const json& p = body["prompt"];
  auto add_text = [&](const std::string& text) {
    if (!model.tokenizer) throw invalid_request("this model has no tokenizer: send the prompt as token ids", "prompt");
    r.engine.prompts.push_back(encode(model, text, true));
    r.prompt_texts.push_back(text);
  };
  auto add_ids = [&](const json& ids) {
    std::vector<int64_t> prompt;
    for (const json& t : ids) {
      if (!t.is_number_integer()) throw invalid_request("a token-id prompt must hold integers only", "prompt");
      prompt.push_back(t.get<int64_t>());
    }
    r.engine.prompts.push_back(prompt);
    r.prompt_texts.push_back(model.tokenizer ? model.tokenizer->decode(std::vector<int32_t>(prompt.begin(), prompt.end()), false) : "");
  };
  if (p.is_string()) {
    add_text(p.get<std::string>());
  } else if (p.is_array() && !p.empty()) {
    if (p[0].is_number_integer()) {
      add_ids(p);
    } else {
      for (const json& e : p) {
        if (e.is_string()) add_text(e.get<std::string>());
        else if (e.is_array()) add_ids(e);
        else throw invalid_request("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists", "prompt");
      }
    }
  } else {
    throw invalid_request("'prompt' must be a non-empty string, list of strings, or list of token ids", "prompt");
  }
  for (const auto& prompt : r.engine.prompts) check_prompt_length(model, prompt, "prompt");
  parse_sampling(body, r, resolve_max_tokens(body, model, r.engine.prompts, 16));
  r.echo = bool_field(body, "echo", false);
  if (present(body, "logprobs")) {
    r.logprobs = true;
    r.top_logprobs = int_field(body, "logprobs", 0, 0, 20);
  }
  if (r.echo && r.logprobs)
    throw invalid_request("'echo' with 'logprobs' (log-probabilities of the prompt) is not supported by meshtrain serve",
                          "echo");
  r.engine.sampling.logprobs = r.logprobs ? r.top_logprobs : -1;
  return r;
}

std::string render_chat(const json& messages, const ServedModel& model, bool add_generation_prompt) {
  if (model.chat_template) {
    json vars = {{"messages", messages},
                 {"add_generation_prompt", add_generation_prompt},
                 {"bos_token", model.bos_token},
                 {"eos_token", model.eos_token}};
    try {
      return model.chat_template->render(vars);
    } catch (const Error& e) {
      throw invalid_request(detail::concat("the model's chat template refused the messages: ", e.what()), "messages");
    }
  }
  std::string text;
  for (const json& m : messages) text += m["role"].get<std::string>() + ": " + m["content"].get<std::string>() + "\n";
  if (add_generation_prompt) text += "assistant:";
  return text;
}

ParsedRequest parse_chat_request(const json& body, const ServedModel& model) {
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  check_model(body, model);
  refuse_unsupported(body);
  if (!model.tokenizer) throw invalid_request("this model has no tokenizer: chat needs one", "messages");
  ParsedRequest r;
  r.api = Api::chat;
  if (!present(body, "messages") || !body["messages"].is_array() || body["messages"].empty())
    throw invalid_request("'messages' must be a non-empty list", "messages");
  // Content parts ([{type: text, text}]) are joined into one string, as the templates expect.
  json messages = json::array();
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    const json& m = body["messages"][i];
    const std::string where = detail::concat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw invalid_request(where + " must be an object with a string 'role'", "messages");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      throw invalid_request(where + ": role '" + role + "' is not one of system, developer, user, assistant", "messages");
    std::string content;
    const json c = m.value("content", json());
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw invalid_request(where + ": only text content parts are supported", "messages");
        content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      throw invalid_request(where + ".content must be a string or a list of text parts", "messages");
    }
    messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", content}});
  }
  const std::string text = render_chat(messages, model, true);
  // A template writes its special tokens (BOS) itself; the plain template gets the tokenizer's.
  r.engine.prompts.push_back(encode(model, text, !model.chat_template));
  check_prompt_length(model, r.engine.prompts[0], "messages");
  parse_sampling(body, r, resolve_max_tokens(body, model, r.engine.prompts, std::nullopt));
  r.logprobs = bool_field(body, "logprobs", false);
  r.top_logprobs = int_field(body, "top_logprobs", 0, 0, 20);
  if (r.top_logprobs > 0 && !r.logprobs)
    throw invalid_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  r.engine.sampling.logprobs = r.logprobs ? r.top_logprobs : -1;
  return r;
}

}  // namespace mt::serve
