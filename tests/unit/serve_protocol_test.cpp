// The text side of `meshtrain serve` with the real GPT-2 tokenizer: streamed text equals the
// whole decode and never shows half a character; stop strings end the text even across
// tokens, and what might begin one is held back; OpenAI request checking (every bad field
// named, 404 for another model); the plain chat template; the metrics text.
#include <gtest/gtest.h>

#include "meshtrain/serve/http_server.h"
#include "meshtrain/serve/openai_protocol.h"
#include "meshtrain/serve/serve_metrics.h"
#include "meshtrain/serve/text_stream.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::testing {
namespace {

using namespace mt::serve;
using nlohmann::json;

std::shared_ptr<tokenizers::Tokenizer> gpt2() {
  static auto t = std::shared_ptr<tokenizers::Tokenizer>(
      tokenizers::load_tokenizer(std::string(MT_DATA_DIR) + "/models/hf-tiny-gpt2/tokenizer.json"));
  return t;
}

std::vector<int64_t> ids_of(const std::string& text) {
  tokenizers::Encoding e = gpt2()->encode(text, false);
  return std::vector<int64_t>(e.ids.begin(), e.ids.end());
}

struct Streamed {
  std::vector<std::string> pieces;
  std::string text;
  bool stopped = false;
};

Streamed stream_text(const std::string& prompt, const std::string& completion, std::vector<std::string> stops) {
  TextStream ts(*gpt2(), ids_of(prompt), std::move(stops));
  Streamed s;
  for (int64_t id : ids_of(completion)) {
    s.pieces.push_back(ts.push(id));
    s.text += s.pieces.back();
    if (ts.stopped()) break;
  }
  s.text += ts.finish();
  s.stopped = ts.stopped();
  return s;
}

TEST(ServeTextStream, PiecesJoinToTheDecodedTextAndNeverSplitACharacter) {
  const std::string completion = " wörld 🎉 done, 日本語 too";
  Streamed s = stream_text("Hello", completion, {});
  EXPECT_EQ(s.text, completion);
  int held = 0;
  for (const std::string& p : s.pieces) {
    EXPECT_EQ(p.find("\xEF\xBF\xBD"), std::string::npos) << "a replacement character was released";
    held += p.empty();
  }
  EXPECT_GT(held, 0) << "the emoji's byte tokens should be held until the character is whole";
  EXPECT_FALSE(s.stopped);
}

TEST(ServeTextStream, StopStringsEndTheTextAcrossTokensAndTheirBeginningsAreHeldBack) {
  Streamed s = stream_text("Once", " upon a time, the quick brown fox jumps", {"k bro", "zzz"});
  EXPECT_EQ(s.text, " upon a time, the quic");
  EXPECT_TRUE(s.stopped);
  // "fox!" never completes: "fox" is held while it might, then released at the end.
  TextStream ts(*gpt2(), ids_of("Once"), {"fox!"});
  std::string released;
  for (int64_t id : ids_of(" the quick brown fox")) released += ts.push(id);
  EXPECT_EQ(released, " the quick brown ");
  EXPECT_EQ(ts.finish(), "fox");
  // The earliest of several stops wins; a stop at the very start leaves no text.
  EXPECT_EQ(stream_text("A", " one two three", {"three", "two"}).text, " one ");
  EXPECT_EQ(stream_text("A", " one two", {" one"}).text, "");
}

ServedModel served() {
  ServedModel m;
  m.name = "tiny";
  m.tokenizer = gpt2();
  m.max_model_len = 64;
  m.max_prompt_tokens = 40;
  m.max_tokens_limit = 63;
  return m;
}

void expect_api_error(const json& body, bool chat, int status, const std::string& param, const std::string& words) {
  try {
    if (chat) parse_chat_request(body, served());
    else parse_completion_request(body, served());
    ADD_FAILURE() << "no error for " << body.dump();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status) << body.dump() << ": " << e.what();
    const json j = e.body();
    EXPECT_EQ(j["error"]["param"], param.empty() ? json() : json(param)) << j.dump();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(ServeProtocol, CompletionRequestsParseAndEveryBadFieldIsNamed) {
  ParsedRequest r = parse_completion_request(
      {{"model", "tiny"}, {"prompt", {"Hello there", "Hi"}}, {"max_tokens", 5}, {"temperature", 0}, {"n", 2},
       {"stop", "\n"}, {"seed", 7}, {"logprobs", 3}, {"stream", true},
       {"stream_options", {{"include_usage", true}}}},
      served());
  ASSERT_EQ(r.engine.prompts.size(), 2u);
  EXPECT_EQ(r.engine.prompts[0], ids_of("Hello there"));
  EXPECT_EQ(r.engine.n, 2);
  EXPECT_EQ(r.engine.sampling.max_tokens, 5);
  EXPECT_EQ(r.engine.sampling.seed, 7u);
  EXPECT_EQ(r.engine.sampling.logprobs, 3);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_TRUE(parse_completion_request({{"prompt", "x"}, {"echo", true}}, served()).echo);
  expect_api_error({{"prompt", "x"}, {"echo", true}, {"logprobs", 1}}, false, 400, "echo", "not supported");
  EXPECT_EQ(parse_completion_request({{"prompt", {1, 2, 3}}}, served()).engine.prompts[0], (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(parse_completion_request({{"prompt", "x"}}, served()).engine.sampling.max_tokens, 16);  // OpenAI's default

  expect_api_error({{"model", "gpt-4"}, {"prompt", "x"}}, false, 404, "model", "'gpt-4' does not exist");
  expect_api_error({{"max_tokens", 3}}, false, 400, "prompt", "'prompt' is required");
  expect_api_error({{"prompt", 5}}, false, 400, "prompt", "'prompt' must be");
  expect_api_error({{"prompt", json::array()}}, false, 400, "prompt", "non-empty");
  expect_api_error({{"prompt", "x"}, {"max_tokens", "ten"}}, false, 400, "max_tokens", "must be an integer, got string");
  expect_api_error({{"prompt", "x"}, {"max_tokens", 64}}, false, 400, "max_tokens", "in [1, 63]");
  expect_api_error({{"prompt", "x"}, {"temperature", 3}}, false, 400, "temperature", "in [0, 2]");
  expect_api_error({{"prompt", "x"}, {"top_p", 0}}, false, 400, "top_p", "> 0");
  expect_api_error({{"prompt", "x"}, {"n", 0}}, false, 400, "n", "in [1, 128]");
  expect_api_error({{"prompt", "x"}, {"stop", {"a", "b", "c", "d", "e"}}}, false, 400, "stop", "at most 4");
  expect_api_error({{"prompt", "x"}, {"stop", {1}}}, false, 400, "stop", "list of strings");
  expect_api_error({{"prompt", "x"}, {"logprobs", 21}}, false, 400, "logprobs", "in [0, 20]");
  expect_api_error({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, false, 400, "stream_options", "stream: true");
  expect_api_error({{"prompt", "x"}, {"presence_penalty", 0.5}}, false, 400, "presence_penalty", "not supported");
  std::string long_text;
  for (int i = 0; i < 30; ++i) long_text += "hello world ";
  expect_api_error({{"prompt", long_text}}, false, 400, "prompt", "at most 40");
  expect_api_error({{"prompt", {1, "a"}}}, false, 400, "prompt", "integers only");
  expect_api_error(json::array({1}), false, 400, "", "JSON object");
}

TEST(ServeProtocol, ChatRequestsUseThePlainTemplateWithoutAModelTemplate) {
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}, {{"type", "text"}, {"text", "!"}}}}}};
  EXPECT_EQ(render_chat(json{{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi!"}}}, served(), true),
            "system: Be brief.\nuser: Hi!\nassistant:");
  ParsedRequest r = parse_chat_request({{"messages", messages}, {"logprobs", true}, {"top_logprobs", 2}}, served());
  EXPECT_EQ(r.engine.prompts[0], ids_of("system: Be brief.\nuser: Hi!\nassistant:"));
  // Without max_tokens a reply may fill the context.
  EXPECT_EQ(r.engine.sampling.max_tokens, 64 - int64_t(r.engine.prompts[0].size()));
  EXPECT_EQ(r.engine.sampling.logprobs, 2);
  expect_api_error({{"messages", json::array()}}, true, 400, "messages", "non-empty list");
  expect_api_error({{"messages", {{{"content", "x"}}}}}, true, 400, "messages", "string 'role'");
  expect_api_error({{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, true, 400, "messages", "role 'robot'");
  expect_api_error({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, true, 400, "messages",
                   "only text content parts");
  expect_api_error({{"messages", messages}, {"top_logprobs", 2}}, true, 400, "top_logprobs", "needs 'logprobs'");
  expect_api_error({{"messages", messages}, {"tools", {{{"type", "function"}}}}}, true, 400, "tools", "not supported");
}

TEST(ServeProtocol, JsonNestingDepthSkipsStrings) {
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth("{\"a\": [[1], {\"b\": \"[[[[\"}]}"), 3);
  EXPECT_EQ(json_nesting_depth("\"\\\"[[\""), 0);
  EXPECT_EQ(json_nesting_depth(std::string(1000, '[')), 1000);
}

TEST(ServeMetrics, PrometheusTextHasCountersGaugesAndCumulativeHistograms) {
  ServeMetrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 400);
  m.observe_latency(0.03);
  m.observe_latency(3.0);
  m.observe_time_to_first_token(0.002);
  EngineStats e;
  e.waiting_requests = 2, e.running_sequences = 3, e.kv_reserved_bytes = 50, e.kv_budget_bytes = 200;
  e.generated_tokens = 1400;  // whole numbers print as digits, not 1.4e+03
  e.batch_size_counts = {0, 5, 0, 2, 1};  // five steps of 1, two of 3, one of 4
  const std::string text = m.render(e);
  for (const char* line : {"meshtrain_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n",
                           "meshtrain_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n",
                           "meshtrain_generation_tokens_total 1400\n", "meshtrain_queue_depth 2\n",
                           "meshtrain_running_sequences 3\n", "meshtrain_kv_cache_usage_ratio 0.25\n",
                           "meshtrain_batch_size_bucket{le=\"1\"} 5\n", "meshtrain_batch_size_bucket{le=\"2\"} 5\n",
                           "meshtrain_batch_size_bucket{le=\"4\"} 8\n", "meshtrain_batch_size_sum 15\n",
                           "meshtrain_request_latency_seconds_bucket{le=\"0.05\"} 1\n",
                           "meshtrain_request_latency_seconds_bucket{le=\"5\"} 2\n",
                           "meshtrain_request_latency_seconds_count 2\n",
                           "meshtrain_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n", "# TYPE meshtrain_queue_depth gauge\n"})
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "\n" << text;
  for (const char* gauge : {"\nmeshtrain_resident_bytes ", "\nmeshtrain_peak_resident_bytes ", "\nmeshtrain_matmul_plans ",
                            "\nmeshtrain_matmul_plans_created_total "})
    EXPECT_NE(text.find(gauge), std::string::npos) << "missing: " << gauge << "\n" << text;
  const size_t at = text.find("\nmeshtrain_resident_bytes ");
  EXPECT_GT(std::stod(text.substr(at + 26)), 1e6) << "a process holds more than a megabyte";
}

}  // namespace
}  // namespace mt::testing
