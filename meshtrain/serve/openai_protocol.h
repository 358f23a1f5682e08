#pragma once
// OpenAI's HTTP API as meshtrain serves it: requests of /v1/completions and
// /v1/chat/completions parsed and checked into engine requests, and the error shape.
// Every check names the offending field, as OpenAI's own errors do.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/serve/engine.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::serve {

class ChatTemplate;  // chat_template.h

// An error answered to the client: HTTP status and OpenAI's {"error": {...}} body.
class ApiError : public Error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string type_, param_, code_;
};
ApiError invalid_request(const std::string& message, const std::string& param = "");

// What the server knows about the model it serves.
struct ServedModel {
  std::string name;  // the id of GET /v1/models; requests naming another get 404
  std::shared_ptr<tokenizers::Tokenizer> tokenizer;
  std::shared_ptr<ChatTemplate> chat_template;  // the model directory's, else null (plain template)
  std::string bos_token, eos_token;             // the chat template's variables
  int64_t max_model_len = 0;                    // prompt + completion tokens
  int64_t max_prompt_tokens = 0;                // per prompt; longer ones get 400
  int64_t max_tokens_limit = 0;                 // largest max_tokens accepted
};

enum class Api { completions, chat };

// A checked request, its prompts tokenized.
struct ParsedRequest {
  Api api = Api::completions;
  EngineRequest engine;
  std::vector<std::string> prompt_texts;  // completions: each prompt's text (for echo)
  std::vector<std::string> stop;          // stop strings: the text ends before the first
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool echo = false;           // completions: the prompt's text before the completion
  bool logprobs = false;       // report the chosen tokens' log-probabilities
  int64_t top_logprobs = 0;    // and the most likely alternatives at each
};

ParsedRequest parse_completion_request(const nlohmann::json& body, const ServedModel& model);
ParsedRequest parse_chat_request(const nlohmann::json& body, const ServedModel& model);

// The prompt text the chat messages become: the model's chat template, or without one
// the plain template (documented in docs/serving.md): each message as "<role>: <content>\n",
// then "assistant:" when a reply is asked for.
std::string render_chat(const nlohmann::json& messages, const ServedModel& model, bool add_generation_prompt);

}  // namespace mt::serve
