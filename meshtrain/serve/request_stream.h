#pragma once
// What one request to the serving engine produces: a stream of token events, one choice
// after another interleaved, which the HTTP layer reads while the engine's loop writes.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace mt::serve {

// OpenAI's finish reasons, plus the two ends a client never asked for.
enum class FinishReason { none, stop, length, cancelled, error };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", ...

struct TokenEvent {
  int64_t choice = 0;
  int64_t token = -1;  // -1: the event carries no token (a cancelled or failed choice)
  bool is_stop_token = false;  // the model's end token: it ends the choice and is not text
  double logprob = 0;          // log-softmax of the model's logits at the token
  std::vector<std::pair<int64_t, double>> top_logprobs;  // the most likely tokens, when asked for
  FinishReason finish = FinishReason::none;               // set on a choice's last event
  std::string error;                                      // with FinishReason::error
};

// The last event of a choice that ends without a token.
TokenEvent finish_event(int64_t choice, FinishReason reason, std::string error = "");

class RequestStream {
 public:
  RequestStream(int64_t choices, int64_t prompt_tokens);

  // Blocks until an event is there (true) or every choice has finished and all events
  // were read (false). With a timeout, false also when it passes (timed_out says so).
  bool next(TokenEvent& event);
  bool next_for(TokenEvent& event, std::chrono::milliseconds timeout, bool& timed_out);

  // The client is gone: the engine drops the request's sequences at its next step, and
  // their KV memory with them. cancel(choice): that choice alone has what it wants (its
  // text reached a stop string).
  void cancel() { cancelled_.store(true); }
  void cancel(int64_t choice);
  bool cancelled() const { return cancelled_.load(); }
  bool cancelled(int64_t choice) const;

  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t choices() const { return choices_; }

  // Engine side.
  void push(TokenEvent event);

 private:
  const int64_t choices_, prompt_tokens_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<TokenEvent> events_;
  int64_t open_choices_;
  std::atomic<bool> cancelled_{false};
  std::vector<bool> cancelled_choices_;  // under mutex_
};

}  // namespace mt::serve
