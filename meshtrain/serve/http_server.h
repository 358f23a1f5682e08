#pragma once
// The HTTP face of `meshtrain serve` (cpp-httplib): OpenAI's routes over the engine, the
// API key check, request limits and the metrics endpoint. Every failure, malformed input
// included, is answered in OpenAI's error shape; nothing a client sends ends the server.
#include <cstdint>
#include <memory>
#include <string>

#include "meshtrain/serve/engine.h"
#include "meshtrain/serve/openai_protocol.h"
#include "meshtrain/serve/serve_metrics.h"

namespace httplib {
class Server;
}

namespace mt::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8000;                 // 0: any free port (bind() says which)
  std::string api_key;             // non-empty: /v1/ routes need "Authorization: Bearer <key>"
  int64_t max_body_bytes = int64_t(1) << 20;
  int threads = 0;                 // HTTP worker threads; 0: enough for every batch slot and the queue
};

class HttpServer {
 public:
  HttpServer(Engine& engine, ServedModel model, ServerOptions options);
  ~HttpServer();

  // Binds the listening socket; returns the port. Throws mt::Error when it cannot.
  int bind();
  // Serves until stop() (from another thread or a signal watcher).
  void run();
  void stop();

 private:
  void install_routes();

  Engine& engine_;
  ServedModel model_;
  ServerOptions options_;
  ServeMetrics metrics_;
  std::unique_ptr<httplib::Server> server_;
  int listen_socket_ = -1;
};

// Longest nesting of arrays and objects in a JSON text (strings skipped): deeper bodies are
// refused before parsing, so that a hostile body cannot exhaust the parser's stack.
int64_t json_nesting_depth(const std::string& text);

}  // namespace mt::serve
