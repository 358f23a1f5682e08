#include "meshtrain/serve/completion_run.h"

#include <ctime>

namespace mt::serve {

using nlohmann::json;

namespace {

json utf8_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

}  // namespace

CompletionRun::CompletionRun(Engine& engine, const ServedModel& model, ParsedRequest request, std::string id)
    : engine_(engine), model_(model), request_(std::move(request)), id_(std::move(id)), created_(std::time(nullptr)) {
  const int64_t n = request_.engine.n;
  choices_.resize(size_t(request_.engine.choices()));
  for (size_t i = 0; i < choices_.size(); ++i)
    if (model_.tokenizer)
      choices_[i].text_stream = std::make_unique<TextStream>(
          *model_.tokenizer, request_.engine.prompts[i / size_t(n)], request_.stop);
  start_ = std::chrono::steady_clock::now();
  try {
    stream_ = engine_.submit(request_.engine);
  } catch (const AdmissionError& e) {
    using Kind = AdmissionError::Kind;
    switch (e.kind()) {
      case Kind::invalid: throw invalid_request(e.what());
      case Kind::too_large: throw ApiError(400, "invalid_request_error", e.what(), "max_tokens", "context_length_exceeded");
      case Kind::queue_full: throw ApiError(429, "rate_limit_error", e.what());
      case Kind::stopped: throw ApiError(503, "service_unavailable", e.what());
    }
    throw;
  }
}

CompletionRun::~CompletionRun() {
  if (!stream_) return;
  for (const Choice& c : choices_)
    if (!c.done) {
      stream_->cancel();
      break;
    }
}

int64_t CompletionRun::completion_tokens() const {
  int64_t n = 0;
  for (const Choice& c : choices_) n += c.tokens;
  return n;
}

json CompletionRun::usage() const {
  const int64_t p = stream_->prompt_tokens(), c = completion_tokens();
  return {{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
}

void CompletionRun::record_logprobs(const TokenEvent& e, Choice& c, size_t offset) {
  if (!request_.logprobs || !model_.tokenizer) return;
  const std::string tok = token_text(*model_.tokenizer, e.token);
  if (request_.api == Api::chat) {
    json top = json::array();
    for (const auto& [id, lp] : e.top_logprobs) {
      const std::string t = token_text(*model_.tokenizer, id);
      top.push_back({{"token", t}, {"logprob", lp}, {"bytes", utf8_bytes(t)}});
    }
    c.logprobs_content.push_back({{"token", tok}, {"logprob", e.logprob}, {"bytes", utf8_bytes(tok)}, {"top_logprobs", top}});
  } else {
    c.lp_tokens.push_back(tok);
    c.lp_values.push_back(e.logprob);
    json top = json::object();
    for (const auto& [id, lp] : e.top_logprobs) top[token_text(*model_.tokenizer, id)] = lp;
    c.lp_top.push_back(request_.top_logprobs > 0 ? top : json());
    c.lp_offsets.push_back(offset);
  }
}

std::string CompletionRun::apply(const TokenEvent& e) {
  Choice& c = choices_[size_t(e.choice)];
  if (c.done) return "";  // events after this choice's stop string
  std::string piece;
  if (e.token >= 0) {
    if (!first_token_s_)
      first_token_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    ++c.tokens;
    if (!e.is_stop_token) {
      c.ids.push_back(e.token);
      record_logprobs(e, c, c.text.size());  // (echo with logprobs is refused, so offsets start at 0)
      if (c.text_stream) piece = c.text_stream->push(e.token);
      if (c.text_stream && c.text_stream->stopped()) {
        c.finish = FinishReason::stop;
        c.done = true;
        stream_->cancel(e.choice);  // the rest of this choice is not wanted
      }
    }
  }
  if (!c.done && e.finish != FinishReason::none) {
    if (c.text_stream) piece += c.text_stream->finish();
    c.finish = e.finish;
    c.done = true;
    if (e.finish == FinishReason::error) error_ = e.error;
  }
  c.text += piece;
  return piece;
}

json CompletionRun::response() {
  TokenEvent e;
  while (stream_->next(e)) apply(e);
  if (!error_.empty()) throw ApiError(500, "server_error", "generation failed: " + error_);
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const char* finish = finish_reason_name(c.finish);
    if (request_.api == Api::chat) {
      json lp = request_.logprobs ? json{{"content", c.logprobs_content}} : json();
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", c.text}}},
                         {"logprobs", lp},
                         {"finish_reason", finish}});
    } else {
      const std::string text =
          (request_.echo ? request_.prompt_texts[i / size_t(request_.engine.n)] : std::string()) + c.text;
      json lp = request_.logprobs ? json{{"tokens", c.lp_tokens},
                                         {"token_logprobs", c.lp_values},
                                         {"top_logprobs", c.lp_top},
                                         {"text_offset", c.lp_offsets}}
                                  : json();
      choices.push_back({{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish}});
      // Without a tokenizer there is no text to give: the generated ids are the answer.
      if (!model_.tokenizer) choices.back()["token_ids"] = c.ids;
    }
  }
  const bool chat = request_.api == Api::chat;
  return {{"id", id_},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_.name},
          {"choices", choices},
          {"usage", usage()}};
}

json CompletionRun::chunk(int64_t index, const std::string& piece, const json& logprobs, FinishReason finish,
                          bool first) {
  const bool chat = request_.api == Api::chat;
  json choice = {{"index", index}, {"logprobs", logprobs},
                 {"finish_reason", finish == FinishReason::none ? json() : json(finish_reason_name(finish))}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!piece.empty() || first) delta["content"] = piece;
    choice["delta"] = delta;
  } else {
    choice["text"] = piece;
  }
  json c = {{"id", id_},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_.name},
            {"choices", json::array({choice})}};
  if (request_.include_usage) c["usage"] = nullptr;
  return c;
}

json CompletionRun::event_logprobs(const TokenEvent& e, const Choice& c) const {
  if (!request_.logprobs || e.token < 0 || e.is_stop_token) return json();
  if (request_.api == Api::chat)
    return c.logprobs_content.empty() ? json() : json{{"content", json::array({c.logprobs_content.back()})}};
  if (c.lp_tokens.empty()) return json();
  return {{"tokens", {c.lp_tokens.back()}},
          {"token_logprobs", {c.lp_values.back()}},
          {"top_logprobs", {c.lp_top.back()}},
          {"text_offset", {c.lp_offsets.back()}}};
}

bool CompletionRun::stream(const std::function<bool(const json&)>& write, const std::function<bool()>& client_alive) {
  const bool chat = request_.api == Api::chat;
  // Echo: the prompt's text opens each completion.
  if (request_.echo && !chat)
    for (size_t i = 0; i < choices_.size(); ++i)
      if (!write(chunk(int64_t(i), request_.prompt_texts[i / size_t(request_.engine.n)], json(), FinishReason::none, false))) {
        stream_->cancel();
        return false;
      }
  TokenEvent e;
  for (;;) {
    bool timed_out = false;
    const bool got = stream_->next_for(e, std::chrono::milliseconds(50), timed_out);
    if (!client_alive()) {
      stream_->cancel();
      return false;
    }
    if (!got) {
      if (timed_out) continue;
      break;  // every choice has finished
    }
    Choice& c = choices_[size_t(e.choice)];
    if (c.done) continue;
    const std::string piece = apply(e);
    if (!error_.empty()) {
      stream_->cancel();
      write(ApiError(500, "server_error", "generation failed: " + error_).body());
      return false;
    }
    const bool first = chat && !c.sent_role;
    if (piece.empty() && !c.done && !first && !(request_.logprobs && e.token >= 0 && !e.is_stop_token)) continue;
    c.sent_role = true;
    if (!write(chunk(e.choice, piece, event_logprobs(e, c), c.done ? c.finish : FinishReason::none, first))) {
      stream_->cancel();
      return false;
    }
  }
  if (request_.include_usage) {
    json last = {{"id", id_},
                 {"object", chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", created_},
                 {"model", model_.name},
                 {"choices", json::array()},
                 {"usage", usage()}};
    if (!write(last)) return false;
  }
  return true;
}

}  // namespace mt::serve
