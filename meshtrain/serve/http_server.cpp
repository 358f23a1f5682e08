#include "meshtrain/serve/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <random>

#include "meshtrain/serve/completion_run.h"

namespace mt::serve {

using nlohmann::json;

namespace {

constexpr int64_t kMaxJsonDepth = 64;

// Bodies may carry text that is not valid UTF-8 (a client's bytes, a byte-level token):
// replaced, never a dump exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void answer(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void answer_error(httplib::Response& res, const ApiError& e) { answer(res, e.status(), e.body()); }

std::string request_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, static_cast<unsigned long long>(salt),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return buf;
}

json parse_body(const httplib::Request& req) {
  if (json_nesting_depth(req.body) > kMaxJsonDepth)
    throw invalid_request(detail::concat("the request body nests deeper than ", kMaxJsonDepth, " levels"));
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) throw invalid_request("the request body is not valid JSON");
  return body;
}

}  // namespace

int64_t json_nesting_depth(const std::string& text) {
  int64_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return deepest;
}

HttpServer::HttpServer(Engine& engine, ServedModel model, ServerOptions options)
    : engine_(engine), model_(std::move(model)), options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {
  // Each streaming client holds a worker thread for its whole response: enough workers for
  // every batch slot and every queued request, so a full queue answers 429 instead of
  // leaving connections unread.
  const int threads = options_.threads > 0
                          ? options_.threads
                          : int(std::max<int64_t>(64, engine_.options().max_batch + engine_.options().max_queue + 8));
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  // SO_REUSEADDR without httplib's default SO_REUSEPORT, which would let a second server bind
  // the same port and share its connections instead of failing. TCP_NODELAY (inherited by
  // accepted connections): each streamed token goes out at once, not after a delayed ACK.
  server_->set_socket_options([this](int sock) {
    listen_socket_ = sock;
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  });
  server_->set_payload_max_length(size_t(options_.max_body_bytes));
  // Clients (the openai SDKs) keep connections open across requests: httplib's default of 5
  // requests per connection would close them under a busy client, mid-exchange.
  server_->set_keep_alive_max_count(100000);
  server_->set_keep_alive_timeout(30);
  server_->set_read_timeout(30, 0);
  server_->set_write_timeout(30, 0);
  install_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = options_.port == 0 ? server_->bind_to_any_port(options_.host)
                                      : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  MT_CHECK(port > 0, "[serve] cannot listen on ", options_.host, ":", options_.port,
           " (in use, or not an address of this machine)");
  // httplib listens with a backlog of 5: a burst of clients would see connections dropped
  // and retried a second later. Listening again on the bound socket raises it.
  if (listen_socket_ >= 0) ::listen(listen_socket_, SOMAXCONN);
  return port;
}

void HttpServer::run() { server_->listen_after_bind(); }

void HttpServer::stop() { server_->stop(); }

void HttpServer::install_routes() {
  httplib::Server& s = *server_;

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + options_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    answer_error(res, ApiError(401, "invalid_request_error",
                               auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                            : "incorrect API key provided",
                               "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });

  // Statuses httplib sets itself (unknown route, body too large, malformed request) get
  // OpenAI's error body; answers that already have one keep it.
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = detail::concat("HTTP ", res.status);
    if (res.status == 404) message = "no route " + req.method + " " + req.path;
    if (res.status == 405) message = "method " + req.method + " is not allowed on " + req.path;
    if (res.status == 413) message = "the request body is too large (--max-body-bytes)";
    if (res.status == 400) message = "malformed HTTP request";
    const char* type = res.status >= 500 ? "server_error" : "invalid_request_error";
    answer(res, res.status, ApiError(res.status, type, message).body());
    return httplib::Server::HandlerResponse::Handled;
  }));

  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    answer(res, 500, ApiError(500, "server_error", what).body());
  });

  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // Unknown paths count under one label, so a scan cannot grow the metrics without bound.
    static const char* known[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"};
    std::string endpoint = "other";
    for (const char* k : known)
      if (req.path == k) endpoint = k;
    if (req.path.rfind("/v1/models/", 0) == 0) endpoint = "/v1/models/{id}";
    metrics_.count_request(endpoint, res.status);
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    answer(res, 200, json{{"status", "ok"}, {"model", model_.name}});
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(engine_.stats()), "text/plain; version=0.0.4");
  });

  auto model_card = [this] {
    return json{{"id", model_.name}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                {"owned_by", "meshtrain"}, {"max_model_len", model_.max_model_len}};
  };
  s.Get("/v1/models", [model_card](const httplib::Request&, httplib::Response& res) {
    answer(res, 200, json{{"object", "list"}, {"data", json::array({model_card()})}});
  });
  s.Get(R"(/v1/models/(.+))", [this, model_card](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] == model_.name) return answer(res, 200, model_card());
    answer_error(res, ApiError(404, "invalid_request_error",
                               detail::concat("The model '", req.matches[1].str(), "' does not exist"), "model",
                               "model_not_found"));
  });

  auto completion = [this](Api api) {
    return [this, api](const httplib::Request& req, httplib::Response& res) {
      const auto start = std::chrono::steady_clock::now();
      std::shared_ptr<CompletionRun> run;
      bool streaming = false;
      try {
        const json body = parse_body(req);
        ParsedRequest parsed = api == Api::chat ? parse_chat_request(body, model_) : parse_completion_request(body, model_);
        streaming = parsed.stream;
        run = std::make_shared<CompletionRun>(engine_, model_, std::move(parsed),
                                              request_id(api == Api::chat ? "chatcmpl" : "cmpl"));
        if (!streaming) {
          answer(res, 200, run->response());
          metrics_.observe_latency(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
          if (run->time_to_first_token()) metrics_.observe_time_to_first_token(*run->time_to_first_token());
          return;
        }
      } catch (const ApiError& e) {
        return answer_error(res, e);
      } catch (const Error& e) {
        return answer_error(res, invalid_request(e.what()));
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream", [this, run, start](size_t, httplib::DataSink& sink) {
            auto send = [&](const std::string& payload) {
              const std::string event = "data: " + payload + "\n\n";
              return sink.write(event.data(), event.size());
            };
            // is_writable also sees a peer that closed (httplib peeks at the socket).
            const bool whole = run->stream([&](const json& chunk) { return send(dump(chunk)); },
                                           [&] { return sink.is_writable(); });
            if (whole && send("[DONE]")) sink.done();
            metrics_.observe_latency(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
            if (run->time_to_first_token()) metrics_.observe_time_to_first_token(*run->time_to_first_token());
            return whole;
          });
    };
  };
  s.Post("/v1/completions", completion(Api::completions));
  s.Post("/v1/chat/completions", completion(Api::chat));
}

}  // namespace mt::serve
