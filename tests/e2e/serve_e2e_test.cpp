// `meshtrain serve` end to end, on a miniGPT trained here for 150 steps on Tiny Shakespeare
// (byte tokens): the official `openai` Python client runs completions, chat, streaming, n > 1,
// stop sequences, logprobs, errors and 32 concurrent streams (tests/python/serve_client.py),
// greedy text equal to `meshtrain generate`'s; a raw socket disconnects mid-stream; a fuzzer sends
// malformed requests and the server answers 4xx and keeps serving, its memory flat over
// 10,000 requests; limits and start-up errors are clear.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/server_process.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ServeE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("mt_serve_e2e_" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    const std::string data = std::string(MT_DATA_DIR) + "/text/tinyshakespeare.txt";
    CliRun r = run_cli("pretrain --data " + data + " --steps 150 --seq-len 128 --eval-fraction 0 --seed 0 --output-dir " +
                       (*dir_ / "run").string() + " --overwrite");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string model() { return (*dir_ / "run" / "model").string(); }
  static std::string log_path(const std::string& name) { return (*dir_ / (name + ".log")).string(); }
  static fs::path* dir_;
};
fs::path* ServeE2E::dir_ = nullptr;

TEST_F(ServeE2E, OfficialOpenAiClientAgainstTheServer) {
  ServerProcess server({"--model", model(), "--port", "0", "--api-key", "test-key", "--served-model-name",
                        "shakespeare", "--max-batch", "16"},
                       log_path("client"));
  ASSERT_GT(server.port(), 0) << server.std_out() << server.log();
  EXPECT_NE(server.std_out().find("listening on http://127.0.0.1:"), std::string::npos) << server.std_out();
  // The reference text: `meshtrain generate` (prompt + 24 greedy tokens).
  CliRun gen = run_cli("generate --model " + model() + " --prompt 'To be' --max-new-tokens 24");
  ASSERT_EQ(gen.code, 0);
  std::string expected = gen.std_out;
  ASSERT_FALSE(expected.empty());
  expected.pop_back();  // generate's newline
  CliRun client = run_command(std::string(MT_VENV_PYTHON) + " tests/python/serve_client.py --base-url " +
                                  server.base_url() + "/v1 --model shakespeare --api-key test-key --prompt 'To be' " +
                                  "--expect-greedy " + shell_quote(expected),
                              "tests/python/serve_client.py");
  EXPECT_EQ(client.code, 0) << client.out;
  EXPECT_NE(client.out.find("all checks passed"), std::string::npos) << client.out;
  EXPECT_TRUE(server.alive());
  EXPECT_EQ(server.stop(), 0) << server.log();
  EXPECT_NE(server.std_out().find("meshtrain serve: stopped"), std::string::npos) << server.std_out();
}

// Sends raw bytes and returns what the server answered until it closed the connection
// (empty if it closed it without a word). The sending side stays open: httplib takes a
// half-closed connection for a client that left, and answers nothing.
std::string raw_exchange(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += size_t(n);
    }
    // Until the server closes, or one whole response is in (it may keep the connection).
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
      reply.append(buf, size_t(n));
      const size_t end = reply.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      const size_t cl = reply.find("Content-Length: ");
      if (cl != std::string::npos && cl < end && reply.size() >= end + 4 + std::stoul(reply.substr(cl + 16))) break;
    }
  }
  close(fd);
  return reply;
}

std::string http_post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

int status_of(const std::string& reply) {
  if (reply.rfind("HTTP/1.1 ", 0) != 0 || reply.size() < 12) return 0;
  return std::atoi(reply.substr(9, 3).c_str());
}

// A random JSON value, sometimes of the wrong type for any field.
json random_value(std::mt19937& rng, int depth = 0) {
  switch (rng() % 12) {
    case 0: return nullptr;
    case 1: return bool(rng() % 2);
    case 2: return int64_t(rng() % 7) - 2;
    case 3: return 1e300;
    case 4: return -9223372036854775807LL;
    case 5: return 18446744073709551615ULL;
    case 6: return "To be";
    case 7: return std::string("\xff\xfe bad utf8");
    case 8: return 0.5;
    case 9: return depth < 3 ? json::array({random_value(rng, depth + 1), random_value(rng, depth + 1)}) : json(3);
    case 10: return depth < 3 ? json{{"role", random_value(rng, depth + 1)}, {"content", random_value(rng, depth + 1)}} : json("x");
    default: return int64_t(rng() % 3);
  }
}

TEST_F(ServeE2E, MalformedRequestsGet4xxAndTheServerKeepsServingWithFlatMemory) {
  ServerProcess server({"--model", model(), "--port", "0", "--max-body-bytes", "65536"}, log_path("fuzz"));
  ASSERT_GT(server.port(), 0) << server.log();
  const int port = server.port();
  std::mt19937 rng(20261124);
  const std::vector<std::string> fields = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n",
                                           "stop", "seed", "logprobs", "echo", "stream", "stream_options", "messages",
                                           "top_logprobs", "max_completion_tokens", "ignore_eos", "best_of"};
  const auto start = std::chrono::steady_clock::now();
  int cases = 0, four_xx = 0, ok = 0, silent = 0;
  for (; cases < 3000 && std::chrono::steady_clock::now() - start < std::chrono::seconds(120); ++cases) {
    std::string bytes;
    const int kind = cases % 6;
    if (kind == 0) {  // random bytes
      bytes.resize(1 + rng() % 300);
      for (char& c : bytes) c = char(rng());
      bytes += "\r\n\r\n";  // a complete header section, so the server answers now
    } else if (kind == 1) {  // a request line and headers gone wrong
      const std::vector<std::string> heads = {"GET / HTTP/9.9\r\n\r\n", "POST /v1/completions\r\n\r\n",
                                              "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                                              std::string("GET /v1/models HTTP/1.1\r\nX-") + std::string(9000, 'a') + ": b\r\n\r\n",
                                              "\r\n\r\n\r\n"};
      bytes = heads[rng() % heads.size()];
    } else if (kind == 2) {  // bodies that are not JSON, too deep, too large
      const std::vector<std::string> bodies = {"{", "{\"prompt\": \"x\"", "nul", std::string(20000, '[') + std::string(20000, ']'),
                                               "\"just a string\"", "[1,2,3]", std::string(70000, ' ') + "{}"};
      bytes = http_post(rng() % 2 ? "/v1/completions" : "/v1/chat/completions", bodies[rng() % bodies.size()]);
    } else {  // JSON objects with random fields and values
      json body = json::object();
      const int n = 1 + int(rng() % 5);
      for (int i = 0; i < n; ++i) body[fields[rng() % fields.size()]] = random_value(rng);
      if (kind == 3) body["prompt"] = "To be";
      if (kind == 4) body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
      body["max_tokens"] = body.contains("max_tokens") && rng() % 2 ? body["max_tokens"] : json(int64_t(rng() % 4));
      bytes = http_post(kind == 4 ? "/v1/chat/completions" : "/v1/completions",
                        body.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    const std::string reply = raw_exchange(port, bytes);
    const int status = status_of(reply);
    ASSERT_TRUE(status == 0 || (status >= 200 && status < 500)) << "status " << status << " for " << bytes.substr(0, 300)
                                                                << "\nreply: " << reply.substr(0, 500);
    if (status >= 400) {
      ++four_xx;
      // Every error body is OpenAI's shape.
      const size_t body_at = reply.find("\r\n\r\n");
      json e = json::parse(reply.substr(body_at + 4), nullptr, false);
      ASSERT_TRUE(!e.is_discarded() && e.contains("error") && e["error"].contains("message") && e["error"].contains("type"))
          << reply.substr(0, 500);
    } else if (status == 200) {
      ++ok;
    } else {
      ++silent;
    }
    ASSERT_TRUE(server.alive()) << "the server died on: " << bytes.substr(0, 300) << "\n" << server.log();
  }
  std::cout << "  fuzz: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s, " << cases << " cases, " << four_xx << " answered 4xx, " << ok << " 200, " << silent
            << " closed without an answer\n";
  EXPECT_GT(four_xx, cases * 3 / 4);
  EXPECT_EQ(cases, 3000) << "the fuzz cases took over 120 s";

  // 10,000 requests over keep-alive connections from 4 clients: memory after the first
  // 1,000 and after all stays within a few MB.
  std::atomic<int> failures{0};
  auto hammer = [&](int count, int seed) {
    httplib::Client client("127.0.0.1", port);
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    std::mt19937 r{uint32_t(seed)};
    for (int i = 0; i < count; ++i) {
      auto send = [&]() -> httplib::Result {
        switch (r() % 4) {
          case 0: return client.Get("/v1/models");
          case 1: return client.Post("/v1/completions", "{\"prompt\": \"To be\", \"max_tokens\": 1}", "application/json");
          case 2: return client.Post("/v1/completions", "{\"prompt\": ", "application/json");
          default:
            return client.Post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}], \"max_tokens\": 1, \"n\": 2}",
                               "application/json");
        }
      };
      httplib::Result res = send();
      if (!res || res->status >= 500) ++failures;
    }
  };
  auto round = [&](int total) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back(hammer, total / 4, t + total);
    for (auto& t : threads) t.join();
  };
  const auto hammer_start = std::chrono::steady_clock::now();
  round(1000);
  const int64_t warm = server.rss_kb();
  round(9000);
  std::cout << "  10,000 requests in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - hammer_start).count() << " s\n";
  const int64_t after = server.rss_kb();
  std::cout << "  RSS after 1,000 requests " << warm << " kB, after 10,000 " << after << " kB\n";
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LT(after - warm, 8 * 1024) << "memory grew by " << (after - warm) << " kB";
  EXPECT_EQ(server.stop(), 0) << server.log();
}

json post_json(int port, const json& body) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(120, 0);
  auto res = client.Post("/v1/completions", body.dump(), "application/json");
  if (!res) return json{{"error", httplib::to_string(res.error())}};
  json j = json::parse(res->body, nullptr, false);
  return j;
}

TEST_F(ServeE2E, TensorParallelOverTwoProcessesAnswersAsOneProcess) {
  ServerProcess one({"--model", model(), "--port", "0"}, log_path("one"));
  ServerProcess tp(mpirun_serve_command(2, {"--model", model(), "--port", "0", "--model-shards", "2"}), log_path("tp"),
                   180, 0);
  ASSERT_GT(one.port(), 0) << one.log();
  ASSERT_GT(tp.port(), 0) << tp.log() << tp.std_out();
  EXPECT_NE(tp.std_out().find("tensor-parallel over 2 processes"), std::string::npos) << tp.std_out();
  double worst = 0;
  for (const char* prompt : {"To be", "ROMEO:", "First Citizen:\nBefore we proceed"}) {
    const json body = {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 1}, {"ignore_eos", true}};
    const json a = post_json(one.port(), body), b = post_json(tp.port(), body);
    ASSERT_TRUE(a.contains("choices") && b.contains("choices")) << a.dump() << b.dump();
    EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]) << prompt;
    const json& la = a["choices"][0]["logprobs"]["token_logprobs"];
    const json& lb = b["choices"][0]["logprobs"]["token_logprobs"];
    ASSERT_EQ(la.size(), lb.size());
    for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, std::fabs(la[i].get<double>() - lb[i].get<double>()));
  }
  std::cout << "  2 processes vs 1, greedy, 3 prompts x 40 tokens: max |logprob diff| = " << worst << "\n";
  EXPECT_LT(worst, 1e-4);
  // Seeded sampling, three choices: the same draws.
  const json sampled = {{"prompt", "To be"}, {"max_tokens", 30}, {"temperature", 0.9}, {"seed", 5}, {"n", 3}};
  EXPECT_EQ(post_json(one.port(), sampled)["choices"], post_json(tp.port(), sampled)["choices"]);
  // Eight at once on the sharded model: each as it is alone.
  const json alone = post_json(tp.port(), {{"prompt", "ROMEO:"}, {"max_tokens", 20}, {"temperature", 0}, {"ignore_eos", true}});
  std::vector<json> answers(8);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i)
    clients.emplace_back([&, i] {
      answers[size_t(i)] = post_json(tp.port(), {{"prompt", "ROMEO:"}, {"max_tokens", 20}, {"temperature", 0}, {"ignore_eos", true}});
    });
  for (auto& c : clients) c.join();
  for (const json& a : answers) EXPECT_EQ(a["choices"][0]["text"], alone["choices"][0]["text"]) << a.dump();
  // SIGTERM to mpirun reaches both ranks: rank 0 stops its loop and tells rank 1 to stop following.
  tp.stop();
  EXPECT_NE(tp.std_out().find("meshtrain serve: stopped"), std::string::npos) << tp.std_out() << tp.log();
  EXPECT_EQ(one.stop(), 0);
}

TEST_F(ServeE2E, ChatUsesTheModelsChatTemplate) {
  // A ChatML template (Qwen's layout) given with --chat-template; chat must answer as the
  // completion of the template's rendering does.
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const std::string file = (*dir_ / "chatml.jinja").string();
  std::ofstream(file) << chatml;
  ServerProcess server({"--model", model(), "--port", "0", "--chat-template", file}, log_path("chatml"));
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.std_out().find("chat template the model's"), std::string::npos) << server.std_out();
  httplib::Client client("127.0.0.1", server.port());
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Who art thou?"}}}}, {"max_tokens", 16}, {"temperature", 0}};
  auto c = client.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->status, 200) << c->body;
  const std::string rendered = "<|im_start|>user\nWho art thou?<|im_end|>\n<|im_start|>assistant\n";
  const json completion = {{"prompt", rendered}, {"max_tokens", 16}, {"temperature", 0}};
  auto p = client.Post("/v1/completions", completion.dump(), "application/json");
  ASSERT_TRUE(p);
  ASSERT_EQ(p->status, 200) << p->body;
  const json cj = json::parse(c->body), pj = json::parse(p->body);
  EXPECT_EQ(cj["choices"][0]["message"]["content"], pj["choices"][0]["text"]);
  EXPECT_EQ(cj["usage"]["prompt_tokens"], pj["usage"]["prompt_tokens"]);
  // The same template from the model directory's tokenizer_config.json (with the EOS text it
  // uses), and chat_template.jinja taking precedence over it.
  const fs::path dir = *dir_ / "model_with_template";
  fs::remove_all(dir);
  fs::copy(model(), dir, fs::copy_options::recursive);
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"chat_template", "{% for m in messages %}{{ m['content'] + eos_token }}{% endfor %}"}, {"eos_token", {{"content", "<|endoftext|>"}}}}.dump();
  {
    ServerProcess own({"--model", dir.string(), "--port", "0"}, log_path("own_template"));
    ASSERT_GT(own.port(), 0) << own.log();
    EXPECT_NE(own.std_out().find("chat template the model's"), std::string::npos) << own.std_out();
    httplib::Client oc("127.0.0.1", own.port());
    auto r1 = oc.Post("/v1/chat/completions", chat.dump(), "application/json");
    auto r2 = oc.Post("/v1/completions", json{{"prompt", "Who art thou?<|endoftext|>"}, {"max_tokens", 16}, {"temperature", 0}}.dump(),
                      "application/json");
    ASSERT_TRUE(r1 && r2);
    EXPECT_EQ(json::parse(r1->body)["choices"][0]["message"]["content"], json::parse(r2->body)["choices"][0]["text"]) << r1->body;
  }
  std::ofstream(dir / "chat_template.jinja") << chatml;
  {
    ServerProcess own({"--model", dir.string(), "--port", "0"}, log_path("own_jinja"));
    ASSERT_GT(own.port(), 0) << own.log();
    httplib::Client oc("127.0.0.1", own.port());
    auto r = oc.Post("/v1/chat/completions", chat.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], cj["choices"][0]["message"]["content"]);
  }
  // A template that refuses the messages answers 400 with its message.
  const std::string strict_file = (*dir_ / "strict.jinja").string();
  std::ofstream(strict_file) << "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with "
                                "the user') }}{% endif %}{{ messages[0]['content'] }}";
  ServerProcess strict({"--model", model(), "--port", "0", "--chat-template", strict_file}, log_path("strict"));
  ASSERT_GT(strict.port(), 0) << strict.log();
  httplib::Client sc("127.0.0.1", strict.port());
  auto refused = sc.Post("/v1/chat/completions",
                         json{{"messages", {{{"role", "system"}, {"content", "x"}}}}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_NE(refused->body.find("Conversations must start with the user"), std::string::npos) << refused->body;
  // A template that does not parse stops the server at start, naming the file.
  const std::string broken = (*dir_ / "broken.jinja").string();
  std::ofstream(broken) << "{% if x %}never closed";
  CliRun bad = run_cli("serve --model " + model() + " --port 0 --chat-template " + broken);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("broken.jinja does not parse"), std::string::npos) << bad.out;
}

int64_t metric(int port, const std::string& name) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  if (!res) return -1;
  std::smatch m;
  const std::regex line("\n" + name + " (\\d+)\n");
  return std::regex_search(res->body, m, line) ? std::stoll(m[1]) : -1;
}

TEST_F(ServeE2E, AClientThatDisconnectsMidStreamFreesItsSequences) {
  ServerProcess server({"--model", model(), "--port", "0"}, log_path("disconnect"));
  ASSERT_GT(server.port(), 0) << server.log();
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t cancelled = metric(server.port(), "meshtrain_cancelled_sequences_total");
    const int64_t tokens = metric(server.port(), "meshtrain_generation_tokens_total");
    // 4 choices x 120 tokens, streamed; the client reads the first bytes and closes.
    const std::string body = json{{"prompt", "To be"}, {"max_tokens", 120}, {"n", 4}, {"temperature", 0},
                                  {"ignore_eos", true}, {"stream", true}}.dump();
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(server.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string request = http_post("/v1/completions", body);
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), ssize_t(request.size()));
    char buf[256];
    ASSERT_GT(recv(fd, buf, sizeof buf, 0), 0);
    close(fd);
    int64_t running = -1;
    for (int polls = 0; polls < 100 && running != 0; ++polls) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      running = metric(server.port(), "meshtrain_running_sequences");
    }
    EXPECT_EQ(running, 0);
    const int64_t total = metric(server.port(), "meshtrain_generation_tokens_total");
    ASSERT_GE(tokens, 0) << "meshtrain_generation_tokens_total not found as a whole number";
    ASSERT_GE(total, tokens);
    const int64_t generated = total - tokens;
    std::cout << "  trial " << trial << ": " << generated << " of 480 tokens generated before the server noticed\n";
    EXPECT_EQ(metric(server.port(), "meshtrain_cancelled_sequences_total") - cancelled, 4);
    EXPECT_LT(generated, 480);
  }
  EXPECT_EQ(server.stop(), 0);
}

TEST_F(ServeE2E, LimitsAndStartupErrorsAreClear) {
  ServerProcess server({"--model", model(), "--port", "0", "--max-body-bytes", "1000", "--max-prompt-tokens", "50"},
                       log_path("limits"));
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client client("127.0.0.1", server.port());
  auto big = client.Post("/v1/completions", "{\"prompt\": \"" + std::string(2000, 'a') + "\"}", "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413) << big->body;
  EXPECT_NE(big->body.find("too large"), std::string::npos) << big->body;
  auto long_prompt = client.Post("/v1/completions", "{\"prompt\": \"" + std::string(80, 'a') + "\"}", "application/json");
  ASSERT_TRUE(long_prompt);
  EXPECT_EQ(long_prompt->status, 400);
  EXPECT_NE(long_prompt->body.find("at most 50"), std::string::npos) << long_prompt->body;
  auto context = client.Post("/v1/completions", "{\"prompt\": \"To be\", \"max_tokens\": 500}", "application/json");
  ASSERT_TRUE(context);
  EXPECT_EQ(context->status, 400);
  EXPECT_NE(context->body.find("max_tokens"), std::string::npos) << context->body;
  // No API key configured: requests need none.
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  // A second server on the same port fails clearly.
  CliRun twice = run_cli("serve --model " + model() + " --port " + std::to_string(server.port()));
  EXPECT_EQ(twice.code, 1);
  EXPECT_NE(twice.out.find("cannot listen on 127.0.0.1:" + std::to_string(server.port())), std::string::npos) << twice.out;
  CliRun missing = run_cli("serve --model /nonexistent/model --port 0");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("/nonexistent/model"), std::string::npos) << missing.out;
  CliRun bert = run_cli("serve --model " + std::string(MT_DATA_DIR) + "/models/hf-tiny-bert --port 0");
  EXPECT_EQ(bert.code, 1);
  EXPECT_NE(bert.out.find("not a decoder"), std::string::npos) << bert.out;
  EXPECT_EQ(server.stop(), 0);
}

}  // namespace
}  // namespace mt::testing
