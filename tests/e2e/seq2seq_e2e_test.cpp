// `meshtrain seq2seq` end to end: a small T5 and a small BART trained from scratch on a
// synthetic task (sort 3-5 distinct words) reach >= 90 % exact match on held-out sources
// with beam search, also with the model split over 2 ranks; predictions.jsonl,
// eval_results.json and the best checkpoint by ROUGE-L are written; bad inputs are clear
// errors that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/run_metrics.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class Seq2SeqE2E : public TempDir {
 protected:
  void SetUp() override {
    TempDir::SetUp();
    const std::vector<std::string> words = {"apple", "bird", "cat", "dog", "egg", "fish",
                                            "goat", "hat", "ink", "jam", "kite", "lamp"};
    std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    for (const auto& w : words) vocab += w + "\n";
    vocab_ = write("vocab.txt", vocab);
    std::mt19937 rng(7);
    auto rows = [&](int n, bool descending) {
      std::string out;
      for (int i = 0; i < n; ++i) {
        std::vector<std::string> ws = words;
        std::shuffle(ws.begin(), ws.end(), rng);
        ws.resize(size_t(3 + rng() % 3));
        std::vector<std::string> sorted = ws;
        std::sort(sorted.begin(), sorted.end());
        if (descending) std::reverse(sorted.begin(), sorted.end());
        auto join = [](const std::vector<std::string>& v) {
          std::string s;
          for (const auto& w : v) s += (s.empty() ? "" : " ") + w;
          return s;
        };
        out += json{{"words", join(ws)}, {"sorted", join(sorted)}}.dump() + "\n";
      }
      return out;
    };
    train_ = write("train.jsonl", rows(1500, false));
    dev_ = write("dev.jsonl", rows(64, false));
    train_desc_ = write("train_desc.jsonl", rows(1500, true));
    dev_desc_ = write("dev_desc.jsonl", rows(64, true));
  }
  std::string common(const std::string& config, const std::string& out) const {
    return "seq2seq --config " + config + " --tokenizer " + vocab_ + " --data " + train_ + " --eval-data " + dev_ +
           " --source-field words --target-field sorted --epochs 6 --per-device-batch-size 32 --max-source-length 8"
           " --max-target-length 8 --num-beams 2 --learning-rate 2e-3 --output-dir " + out;
  }
  json results(const fs::path& out) const {
    std::ifstream in(out / "eval_results.json");
    json j;
    in >> j;
    return j;
  }
  std::string vocab_, train_, dev_, train_desc_, dev_desc_;
};

TEST_F(Seq2SeqE2E, SmallT5AndBartLearnToSortWords) {
  for (const std::string model : {"t5", "bart"}) {
    const fs::path out = dir_ / model;
    CliRun r = run_cli(common("small-" + model, out.string()));
    ASSERT_EQ(r.code, 0) << r.out;
    const json j = results(out);
    std::cout << "[seq2seq] small-" << model << ": " << j.dump() << "\n";
    EXPECT_GE(j.at("exact_match").get<double>(), 0.9) << model;
    EXPECT_GE(j.at("rougeL").get<double>(), 0.95) << model;
    EXPECT_GE(j.at("token_accuracy").get<double>(), j.at("exact_match").get<double>()) << model;
    EXPECT_EQ(j.at("best").at("metric"), "rougeL");
    EXPECT_TRUE(fs::exists(out / "checkpoints" / "best" / "meta.json"));
    EXPECT_TRUE(fs::exists(out / "model" / "config.json") && fs::exists(out / "model" / "model.safetensors"));
    std::ifstream preds(out / "predictions.jsonl");
    std::string line;
    int n = 0, right = 0;
    while (std::getline(preds, line)) {
      const json p = json::parse(line);
      ASSERT_TRUE(p.contains("source") && p.contains("target") && p.contains("prediction")) << line;
      right += p["prediction"] == p["target"], ++n;
    }
    EXPECT_EQ(n, 64);
    EXPECT_NEAR(double(right) / n, j.at("exact_match").get<double>(), 1e-12);
    // `generate` takes the saved encoder-decoder: --prompt is the source, the output is the
    // decoder's text, the same as evaluation's beam search predicted for that row.
    std::ifstream again(out / "predictions.jsonl");
    std::getline(again, line);
    const json first = json::parse(line);
    CliRun g = run_cli("generate --model " + (out / "model").string() + " --tokenizer " + vocab_ + " --prompt \"" +
                       first["source"].get<std::string>() + "\" --num-beams 2 --max-new-tokens 8");
    ASSERT_EQ(g.code, 0) << g.out;
    EXPECT_EQ(g.std_out, first["prediction"].get<std::string>() + "\n") << model;
  }
}

// BART's own tokenizer shape: a tokenizer.json with byte-level BPE and RobertaProcessing
// (<s> A </s>), <pad> and <mask> as added tokens. Sources and labels carry <s> ... </s>, the
// model directory keeps the tokenizer.json, and generate (without --tokenizer) decodes the
// saved model's prediction the same way evaluation did.
std::string bart_tokenizer_json(const std::vector<std::string>& words) {
  json vocab = {{"<s>", 0}, {"<pad>", 1}, {"</s>", 2}, {"<unk>", 3}};
  json merges = json::array();
  auto add = [&](const std::string& token) {
    if (!vocab.contains(token)) vocab[token] = int(vocab.size());
  };
  const std::string space = "\u0120";  // byte-level BPE's stand-in for a leading space
  add(space);
  for (char c = 'a'; c <= 'z'; ++c) add(std::string(1, c));
  // Merges build each word left to right, the space-led forms first (so " dog" is one
  // token, not " " + "dog"): every word is one token and 5 words fit --max-source-length 8.
  for (const std::string& start : {space, std::string()})
    for (const std::string& w : words) {
      std::string token = start.empty() ? w.substr(0, 1) : start;
      for (size_t i = start.empty() ? 1 : 0; i < w.size(); ++i) {
        merges.push_back(token + " " + w.substr(i, 1));
        token += w.substr(i, 1);
        add(token);
      }
    }
  const int mask_id = int(vocab.size());
  auto added = [](int id, const std::string& content, bool lstrip) {
    return json{{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", lstrip},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json tok = {{"version", "1.0"},
              {"added_tokens", {added(0, "<s>", false), added(1, "<pad>", false), added(2, "</s>", false),
                                added(3, "<unk>", false), added(mask_id, "<mask>", true)}},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
              {"post_processor", {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 0}},
                                  {"trim_offsets", true}, {"add_prefix_space", false}}},
              {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
              {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                         {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"vocab", vocab}, {"merges", merges}}}};
  tok["added_tokens"][4]["id"] = mask_id;
  return tok.dump();
}

TEST_F(Seq2SeqE2E, BartWithARobertaProcessingTokenizerJson) {
  const std::vector<std::string> words = {"apple", "bird", "cat", "dog",  "egg", "fish",
                                          "goat",  "hat",  "ink", "jam", "kite", "lamp"};
  const std::string tokenizer = write("tokenizer.json", bart_tokenizer_json(words));
  const fs::path out = dir_ / "bart_bpe";
  CliRun r = run_cli("seq2seq --config small-bart --tokenizer " + tokenizer + " --data " + train_ + " --eval-data " + dev_ +
                     " --source-field words --target-field sorted --epochs 6 --per-device-batch-size 32"
                     " --max-source-length 8 --max-target-length 8 --num-beams 2 --learning-rate 2e-3 --output-dir " +
                     out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = results(out);
  std::cout << "[seq2seq] small-bart with a RobertaProcessing tokenizer.json: " << j.dump() << "\n";
  EXPECT_GE(j.at("exact_match").get<double>(), 0.9);
  EXPECT_TRUE(fs::exists(out / "model" / "tokenizer.json"));
  std::ifstream preds(out / "predictions.jsonl");
  std::string line;
  std::getline(preds, line);
  const json first = json::parse(line);
  EXPECT_EQ(first["prediction"].get<std::string>().find('<'), std::string::npos) << line;  // no <s>, </s> in text
  CliRun g = run_cli("generate --model " + (out / "model").string() + " --prompt \"" + first["source"].get<std::string>() +
                     "\" --num-beams 2 --max-new-tokens 8");
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.std_out, first["prediction"].get<std::string>() + "\n");
}

// LoRA: a BART trained to sort ascending learns to sort descending through rank-8 q/v
// adapters alone (its base weights frozen); the adapter is saved in PEFT's layout and, applied
// with generate --adapter, reproduces evaluation's prediction; --merge-lora also exports the
// merged model, which predicts the same.
TEST_F(Seq2SeqE2E, LoraAdaptersTeachATrainedBartANewTask) {
  const fs::path base = dir_ / "base", lora = dir_ / "lora";
  ASSERT_EQ(run_cli(common("small-bart", base.string())).code, 0);
  const std::string lora_args = "seq2seq --model " + (base / "model").string() + " --data " + train_desc_ +
                                " --eval-data " + dev_desc_ +
                                " --source-field words --target-field sorted --epochs 10 --per-device-batch-size 32"
                                " --max-source-length 8 --max-target-length 8 --num-beams 2 --learning-rate 5e-3"
                                " --lora-rank 8 --merge-lora --output-dir " + lora.string();
  CliRun r = run_cli(lora_args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("LoRA rank 8, "), std::string::npos) << r.out;
  const json j = results(lora);
  std::cout << "[seq2seq] small-bart + LoRA r8 (q/v) on descending order: " << j.dump() << "\n";
  EXPECT_GE(j.at("exact_match").get<double>(), 0.9);
  // Before the adapters the model sorts ascending: no held-out target matches.
  std::ifstream metrics(lora / "metrics.jsonl");
  std::string line;
  std::getline(metrics, line);
  EXPECT_GT(json::parse(line).at("loss").get<double>(), 3.0) << line;
  std::ifstream cfg(lora / "adapter" / "adapter_config.json");
  const json adapter = json::parse(cfg);
  EXPECT_EQ(adapter.at("task_type"), "SEQ_2_SEQ_LM");
  EXPECT_EQ(adapter.at("r"), 8);
  EXPECT_EQ(adapter.at("target_modules"), json::array({"q_proj", "v_proj"}));
  EXPECT_TRUE(fs::exists(lora / "adapter" / "adapter_model.safetensors"));
  std::ifstream preds(lora / "predictions.jsonl");
  std::getline(preds, line);
  const json first = json::parse(line);
  const std::string gen = " --tokenizer " + vocab_ + " --prompt \"" + first["source"].get<std::string>() +
                          "\" --num-beams 2 --max-new-tokens 8";
  CliRun with_adapter = run_cli("generate --model " + (base / "model").string() + " --adapter " +
                                (lora / "adapter").string() + gen);
  ASSERT_EQ(with_adapter.code, 0) << with_adapter.out;
  EXPECT_EQ(with_adapter.std_out, first["prediction"].get<std::string>() + "\n");
  CliRun merged = run_cli("generate --model " + (lora / "model").string() + gen);
  ASSERT_EQ(merged.code, 0) << merged.out;
  EXPECT_EQ(merged.std_out, with_adapter.std_out);
}

TEST_F(Seq2SeqE2E, T5OnTwoModelShards) {
  const fs::path out = dir_ / "tp";
  CliRun r = run_cli_mpi(2, common("small-t5", out.string()) + " --model-shards 2 --print-plan");
  ASSERT_EQ(r.code, 0) << r.out;
  // The plan splits self- and cross-attention, the MLP and the position bias by heads.
  for (const char* row : {"decoder.block.0.layer.1.EncDecAttention.q.weight", "q/k/v: output features",
                          "relative_attention_bias.weight", "position bias: heads", "MLP out: input features"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row;
  const json j = results(out);
  std::cout << "[seq2seq] small-t5 on 2 model shards: " << j.dump() << "\n";
  EXPECT_GE(j.at("exact_match").get<double>(), 0.9);
}

// Data-parallel ranks collate their slices apart, and rows of 3 to 5 words make slices of
// different lengths: before each step the ranks pad their sources and targets to the longest
// among them (train/batch_shapes.h), which is the global batch's longest, so they take the
// steps of one process padding its batch to its longest rows (dropout included: its masks
// follow the padded shape, the same on both).
TEST_F(Seq2SeqE2E, DataParallelRanksTakeTheOneProcessSteps) {
  auto command = [&](const fs::path& out, int per_device_batch) {
    return "seq2seq --config small-bart --tokenizer " + vocab_ + " --data " + train_ + " --eval-data " + dev_ +
           " --source-field words --target-field sorted --steps 8 --per-device-batch-size " +
           std::to_string(per_device_batch) + " --max-source-length 8 --max-target-length 8 --num-beams 1"
           " --learning-rate 2e-3 --output-dir " + out.string();
  };
  ASSERT_EQ(run_cli(command(dir_ / "one", 16)).code, 0);
  const CliRun two = run_cli_mpi(2, command(dir_ / "two", 8) + " --mesh data=2");
  ASSERT_EQ(two.code, 0) << two.out;
  const auto a = train_losses(dir_ / "one"), b = train_losses(dir_ / "two");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  double err = 0;
  for (const auto& [step, loss] : a) err = std::max(err, std::abs(b.at(step) - loss));
  std::cout << "[seq2seq] small-bart, data=2 vs one process over 8 steps: max |loss difference| " << err << "\n";
  EXPECT_LT(err, 1e-4);
}

TEST_F(Seq2SeqE2E, BadInputsAreClearErrors) {
  const std::string bad = write("bad.jsonl", "{\"words\": \"a b\", \"sorted\": \"a b\"}\n{\"words\": \"c\"}\n");
  const std::string empty = write("empty.jsonl", "{\"words\": \"a b\", \"sorted\": \"\"}\n");
  const std::string gpt2 = write("gpt2.json", R"({"model_type": "gpt2", "vocab_size": 17, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 16})");
  const fs::path out = dir_ / "never";
  struct Case {
    std::string args, expect;
  };
  const std::string base = "seq2seq --tokenizer " + vocab_ + " --source-field words --target-field sorted --output-dir " + out.string();
  for (const Case& c : std::vector<Case>{
           {base + " --config small-t5 --data " + bad + " --eval-data " + dev_, bad + ":2"},
           {base + " --config small-t5 --data " + empty + " --eval-data " + dev_, "row 1 has an empty target ('sorted')"},
           {base + " --config small-t5 --num-beams 0 --data " + train_ + " --eval-data " + dev_, "--num-beams must be >= 1, got 0"},
           {base + " --config " + gpt2 + " --data " + train_ + " --eval-data " + dev_, "model_type 'gpt2' is not an encoder-decoder (use t5 or bart)"},
           {base + " --config small-mbart --data " + train_ + " --eval-data " + dev_, "unknown --config 'small-mbart'"}}) {
    CliRun r = run_cli(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in:\n" << r.out;
    EXPECT_FALSE(fs::exists(out / "checkpoints")) << "an error after writing checkpoints: " << c.args;
  }
}

}  // namespace
}  // namespace mt::testing
