#include "meshtrain/serve/request_stream.h"

namespace mt::serve {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "none";
}

TokenEvent finish_event(int64_t choice, FinishReason reason, std::string error) {
  TokenEvent e;
  e.choice = choice;
  e.finish = reason;
  e.error = std::move(error);
  return e;
}

RequestStream::RequestStream(int64_t choices, int64_t prompt_tokens)
    : choices_(choices), prompt_tokens_(prompt_tokens), open_choices_(choices), cancelled_choices_(size_t(choices)) {}

void RequestStream::cancel(int64_t choice) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (choice >= 0 && choice < choices_) cancelled_choices_[size_t(choice)] = true;
}

bool RequestStream::cancelled(int64_t choice) const {
  if (cancelled_.load()) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  return choice >= 0 && choice < choices_ && cancelled_choices_[size_t(choice)];
}

void RequestStream::push(TokenEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (event.finish != FinishReason::none) --open_choices_;
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

bool RequestStream::next(TokenEvent& event) {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [&] { return !events_.empty() || open_choices_ == 0; });
  if (events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool RequestStream::next_for(TokenEvent& event, std::chrono::milliseconds timeout, bool& timed_out) {
  std::unique_lock<std::mutex> lock(mutex_);
  timed_out = !ready_.wait_for(lock, timeout, [&] { return !events_.empty() || open_choices_ == 0; });
  if (timed_out || events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

}  // namespace mt::serve
