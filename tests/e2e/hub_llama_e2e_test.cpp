// A LLaMA folder as the Hugging Face Hub publishes it (save_pretrained of a small
// LlamaForCausalLM with tie_word_embeddings: the shared matrix stored once, as
// lm_head.weight; a LLaMA-style tokenizer.json with byte fallback) generates through
// `meshtrain generate --prompt` exactly what an independent PyTorch forward of the same
// weights generates greedily. A folder lacking a weight is refused, naming it, unless
// --allow-new-heads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshtrain/io/safetensors.h"
#include "meshtrain/models/llama.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "tests/support/cli_run.h"
#include "tests/support/llama_tokenizer_fixture.h"
#include "tests/support/model_twins.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tokenizer_oracle.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct HubFolder {
  json config;
  Params params;  // as the model holds them (the tied matrix as model.embed_tokens.weight)
};

// Writes config.json, model.safetensors (keys in `stored`: the tied matrix under
// `tied_key`, or left out when empty) and tokenizer.json into `dir`.
HubFolder write_hub_llama(const fs::path& dir, const std::string& tied_key) {
  fs::create_directories(dir);
  const json tok = test::llama_tokenizer_json(test::shakespeare_prefix(300000), {.name = "hub"}, 600);
  std::ofstream(dir / "tokenizer.json") << tok.dump(2);
  HubFolder f;
  f.config = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", 128},
              {"intermediate_size", 256},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"vocab_size", tok["model"]["vocab"].size()},
              {"max_position_embeddings", 256},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", true},
              {"bos_token_id", 1},
              {"eos_token_id", 2},
              {"torch_dtype", "float32"}};
  std::ofstream(dir / "config.json") << f.config.dump(2);
  const models::ModelSpec& spec = models::model_spec("llama");
  const auto defs = spec.param_defs(spec.parse_config(f.config, {}));
  // Spread logits (embedding std 0.5), so greedy choices are far from ties.
  uint64_t seed = 100;
  for (const auto& d : defs) {
    std::vector<float> v = random_normal(d.shape, seed++).to_floats();
    const bool norm = d.path.find("norm") != std::string::npos;
    const float scale = d.path == "model.embed_tokens.weight" ? 0.5f : norm ? 0.1f : 0.3f;
    for (float& x : v) x = (norm ? 1.0f : 0.0f) + scale * x;
    f.params.set(d.path, Array::from_vector(v, d.shape));
  }
  Params stored;
  for (const auto& [k, v] : f.params)
    if (k != "model.embed_tokens.weight") stored.set(k, v);
  if (!tied_key.empty()) stored.set(tied_key, f.params["model.embed_tokens.weight"]);
  io::save_safetensors((dir / "model.safetensors").string(), stored, {{"format", "pt"}});
  return f;
}

std::vector<int64_t> parse_ids(const std::string& line) {
  std::istringstream in(line);
  std::vector<int64_t> ids;
  for (int64_t x; in >> x;) ids.push_back(x);
  return ids;
}

class HubLlamaE2E : public TempDir {};

TEST_F(HubLlamaE2E, TiedHeadStoredOnceGeneratesLikePyTorch) {
  const fs::path dir = dir_ / "tinystories-llama";
  const HubFolder f = write_hub_llama(dir, "lm_head.weight");
  const std::string prompt_text = "Once upon a time";

  // The prompt's ids: ours equal Hugging Face `tokenizers`' (BOS, then the text).
  auto tok = tokenizers::load_tokenizer(dir.string());
  const tokenizers::Encoding enc = tok->encode(prompt_text);
  const auto hf = test::run_oracle("--json " + (dir / "tokenizer.json").string(), {{prompt_text, std::nullopt}});
  ASSERT_EQ(hf.size(), 1u);
  EXPECT_EQ(enc.ids, hf[0].ids);
  EXPECT_EQ(enc.ids.front(), 1);
  std::vector<int64_t> prompt(enc.ids.begin(), enc.ids.end());

  // The twin: HF LLaMA (half-split rotary), recomputing the whole sequence per token, the
  // head being the embedding (no lm_head in P).
  const int64_t n = 24;
  std::vector<OracleTensor> inputs;
  std::string names = "names = [";
  for (const auto& [path, value] : f.params) names += "'" + path + "', ", inputs.push_back(to_oracle(value));
  inputs.push_back(to_oracle(Array::from_vector(prompt, Shape{1, int64_t(prompt.size())})));
  OracleResult ref = TorchOracle::instance().run(
      twin_library() + names + "]\nP = dict(zip(names, xs[:len(names)]))\nout = greedy_twin(P, xs[-1], " +
          std::to_string(n) + ", 2, 8, 4, 1e-6, 10000.0, False)\n",
      inputs);
  const std::vector<int64_t> twin(ref.outputs[0].data.begin(), ref.outputs[0].data.end());

  // `generate --prompt-ids` prints the ids; `generate --prompt` the decoded text.
  std::string ids_arg;
  for (int64_t t : prompt) ids_arg += (ids_arg.empty() ? "" : " ") + std::to_string(t);
  CliRun by_ids = run_cli("generate --model " + dir.string() + " --prompt-ids \"" + ids_arg + "\" --max-new-tokens " +
                          std::to_string(n) + " --no-stop");
  ASSERT_EQ(by_ids.code, 0);
  EXPECT_EQ(parse_ids(by_ids.std_out), twin);
  EXPECT_NE(by_ids.out.find("Loaded model.embed_tokens.weight of LlamaForCausalLM from lm_head.weight"), std::string::npos)
      << "the load report names the tied key it read";
  CliRun by_text = run_cli("generate --model " + dir.string() + " --prompt \"" + prompt_text + "\" --max-new-tokens " +
                           std::to_string(n) + " --no-stop");
  ASSERT_EQ(by_text.code, 0);
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), twin.begin(), twin.end());
  EXPECT_EQ(by_text.std_out, tok->decode(all) + "\n");
  EXPECT_EQ(by_text.std_out.rfind(prompt_text, 0), 0u);

  // The same weights stored the usual way (model.embed_tokens.weight only) load identically.
  const fs::path usual = dir_ / "usual";
  write_hub_llama(usual, "model.embed_tokens.weight");
  CliRun usual_ids = run_cli("generate --model " + usual.string() + " --prompt-ids \"" + ids_arg +
                             "\" --max-new-tokens " + std::to_string(n) + " --no-stop");
  EXPECT_EQ(parse_ids(usual_ids.std_out), twin);
}

TEST_F(HubLlamaE2E, MissingWeightIsRefusedUnlessAllowed) {
  const fs::path dir = dir_ / "no-embedding";
  write_hub_llama(dir, "");
  CliRun refused = run_cli("generate --model " + dir.string() + " --prompt \"Once\" --max-new-tokens 2");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.out.find("no weights for 1 of the"), std::string::npos);
  EXPECT_NE(refused.out.find("[model.embed_tokens.weight]"), std::string::npos);
  EXPECT_NE(refused.out.find("--allow-new-heads"), std::string::npos);
  CliRun allowed = run_cli("generate --model " + dir.string() + " --prompt \"Once\" --max-new-tokens 2 --allow-new-heads");
  EXPECT_EQ(allowed.code, 0);
  EXPECT_NE(allowed.out.find("newly initialized: [model.embed_tokens.weight]"), std::string::npos);
}

}  // namespace
}  // namespace mt::testing
