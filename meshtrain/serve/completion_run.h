#pragma once
// One request's life on the server: submitted to the engine, its token events turned into
// text per choice (stop strings, logprobs, usage), answered as OpenAI's JSON: one response,
// or a chunk per event for streaming.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/serve/engine.h"
#include "meshtrain/serve/openai_protocol.h"
#include "meshtrain/serve/text_stream.h"

namespace mt::serve {

class CompletionRun {
 public:
  // Submits the request; throws ApiError when the engine refuses it (400 / 429 / 503).
  CompletionRun(Engine& engine, const ServedModel& model, ParsedRequest request, std::string id);
  ~CompletionRun();  // a run abandoned early cancels its sequences

  // Waits for every choice; the whole response (throws ApiError 500 if generation failed).
  nlohmann::json response();

  // Calls `write` with each chunk (server-sent event payloads) until every choice is done,
  // then the usage chunk when asked for. A false from `write`, or from `client_alive` (asked
  // before each chunk and every 50 ms while none comes), means the client left: the request
  // is cancelled at the engine's next step and stream returns false.
  bool stream(const std::function<bool(const nlohmann::json&)>& write, const std::function<bool()>& client_alive);

  // Seconds from submission to the first token (after the run), and totals for metrics.
  std::optional<double> time_to_first_token() const { return first_token_s_; }
  int64_t completion_tokens() const;
  int64_t prompt_tokens() const { return stream_->prompt_tokens(); }

 private:
  struct Choice {
    std::unique_ptr<TextStream> text_stream;
    std::string text;       // released text
    int64_t tokens = 0;     // generated, end token included
    std::vector<int64_t> ids;  // generated, end token excluded (a model without a tokenizer returns them)
    FinishReason finish = FinishReason::none;
    bool done = false;
    bool sent_role = false;  // chat streaming: the first delta carries the role
    nlohmann::json logprobs_content = nlohmann::json::array();  // chat
    nlohmann::json lp_tokens = nlohmann::json::array(), lp_values = nlohmann::json::array(),
                   lp_top = nlohmann::json::array(), lp_offsets = nlohmann::json::array();  // completions
  };
  // Applies one event; returns the text it released (may be empty).
  std::string apply(const TokenEvent& e);
  nlohmann::json usage() const;
  nlohmann::json chunk(int64_t index, const std::string& piece, const nlohmann::json& logprobs, FinishReason finish,
                       bool first);
  nlohmann::json event_logprobs(const TokenEvent& e, const Choice& c) const;
  void record_logprobs(const TokenEvent& e, Choice& c, size_t offset);

  Engine& engine_;
  const ServedModel& model_;
  ParsedRequest request_;
  std::string id_;
  int64_t created_;
  std::shared_ptr<RequestStream> stream_;
  std::vector<Choice> choices_;
  std::string error_;
  std::chrono::steady_clock::time_point start_;
  std::optional<double> first_token_s_;
};

}  // namespace mt::serve
