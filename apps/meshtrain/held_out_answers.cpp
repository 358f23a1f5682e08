#include "apps/meshtrain/held_out_answers.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "meshtrain/models/generate.h"

namespace mt::cli {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

std::string greedy_completion(const models::PretrainedModel& model, const Params& params, const tokenizers::Tokenizer& tok,
                              const std::string& prompt, int64_t new_tokens, std::optional<int64_t> eos) {
  tokenizers::Encoding e = tok.encode(prompt, true);
  std::vector<int64_t> ids(e.ids.begin(), e.ids.end());
  models::PretrainedModel m = model;
  m.params = params;
  models::GenerationConfig g;
  g.max_new_tokens = new_tokens;
  if (eos) g.stop_tokens = {*eos};
  models::CausalLm lm = m.causal_lm();
  models::GenerationResult r = models::generate(models::restrict_vocab(lm, std::min(lm.vocab_size, tok.vocab_size())), {ids}, g);
  std::vector<int32_t> out;
  for (int64_t t : r.tokens[0])
    if (!eos || t != *eos) out.push_back(int32_t(t));
  return tok.decode(out, true);
}

int64_t exact_answers(const models::PretrainedModel& model, const Params& params, const tokenizers::Tokenizer& tok,
                      const std::vector<std::string>& prompts, const std::vector<std::string>& responses, int64_t rows,
                      int64_t new_tokens, std::optional<int64_t> eos, const std::string& when,
                      const train::Deployer& deployer) {
  const int64_t n = std::min<int64_t>(rows, int64_t(std::min(prompts.size(), responses.size())));
  if (n == 0) return 0;  // --check-rows 0: nothing to say
  int64_t right = 0;
  for (int64_t i = 0; i < n; ++i) {
    const std::string& prompt = prompts[size_t(i)];
    const std::string got = greedy_completion(model, params, tok, prompt, new_tokens, eos);
    const bool ok = trim(got) == trim(responses[size_t(i)]);
    right += ok;
    if (i < 3)
      deployer.log("  [" + when + "] " + nlohmann::json(prompt).dump() + " -> " + nlohmann::json(got).dump() +
                   (ok ? "  (right)" : ""));
  }
  deployer.log("held-out answers " + when + ": " + std::to_string(right) + "/" + std::to_string(n) + " exact");
  return right;
}

}  // namespace mt::cli
