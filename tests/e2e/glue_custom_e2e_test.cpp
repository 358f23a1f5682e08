// `meshtrain glue` beyond the GLUE directory: a user's own CSV / JSON-lines rows with named
// classes (--train_file / --validation_file, as HF's run_glue takes them) train, keep the
// class names in config.json's id2label and score the same under `eval --validation-file`;
// LoRA on a pretrained BERT writes a PEFT SEQ_CLS adapter whose trained head travels as
// modules_to_save, and the adapter on its base scores exactly as the merged model.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/io/safetensors.h"
#include "tests/support/cli_run.h"
#include "tests/support/run_metrics.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kGlue = std::string(MT_DATA_DIR) + "/glue";
const std::string kVocab = std::string(MT_DATA_DIR) + "/tokenizers/bert-base-uncased-vocab.txt";
const std::string kTinyBert = std::string(MT_DATA_DIR) + "/models/hf-tiny-bert";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// The JSON printed by `eval` (after its log lines).
json eval_output(const CliRun& r) { return json::parse(r.std_out.substr(r.std_out.find('{'))); }

class GlueCustomE2E : public TempDir {
 protected:
  // SST-2 rows (sentence, 0/1) from the shipped GLUE copy, the first `n` of `split`.
  static std::vector<std::pair<std::string, std::string>> sst2(const std::string& split, size_t n) {
    std::ifstream in(kGlue + "/SST-2/" + split + ".tsv");
    std::string line;
    std::getline(in, line);  // header
    std::vector<std::pair<std::string, std::string>> rows;
    while (rows.size() < n && std::getline(in, line)) {
      const size_t tab = line.rfind('\t');
      rows.emplace_back(line.substr(0, tab), line.substr(tab + 1));
    }
    return rows;
  }
};

TEST_F(GlueCustomE2E, OwnCsvAndJsonLinesWithNamedClasses) {
  const char* names[] = {"negative", "positive"};
  std::string csv = "idx,sentence,label\n";
  int idx = 0;
  for (const auto& [text, label] : sst2("train", 320)) {
    std::string quoted;
    for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    csv += std::to_string(idx++) + ",\"" + quoted + "\"," + names[label == "1"] + "\n";
  }
  std::string jsonl;
  for (const auto& [text, label] : sst2("dev", 64))
    jsonl += json{{"sentence", text}, {"label", names[label == "1"]}}.dump() + "\n";
  const std::string train = write("train.csv", csv), dev = write("dev.jsonl", jsonl);
  const fs::path out = dir_ / "run";
  const std::string common = "glue --config small --tokenizer " + kVocab + " --max_seq_length 64 --num_train_epochs 2 "
                             "--per_device_train_batch_size 16 --learning_rate 1e-3 --train_file " + train + " ";
  CliRun r = run_cli(common + "--validation_file " + dev + " --output_dir " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("320 train / 64 eval rows"), std::string::npos);
  const json results = read_json(out / "eval_results.json");
  ASSERT_TRUE(results.contains("eval_accuracy"));
  EXPECT_EQ(results["best"]["metric"], "accuracy");
  const json config = read_json(out / "model" / "config.json");
  EXPECT_EQ(config["id2label"], (json{{"0", "negative"}, {"1", "positive"}}));
  EXPECT_EQ(config["label2id"], (json{{"negative", 0}, {"positive", 1}}));
  // `eval` maps the file's class names through the saved id2label: the final model scores
  // what the run's last evaluation reported.
  CliRun e = run_cli("eval --model " + (out / "model").string() + " --validation-file " + dev + " --max-seq-length 64");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(eval_output(e)["eval_accuracy"], results["eval_accuracy"]);
  std::cout << "  own data: eval accuracy " << results["eval_accuracy"] << " (train and eval), "
            << eval_output(e)["eval_accuracy"] << " (eval --validation-file)\n";
#ifdef MT_MPIRUN
  // eval cuts each batch to its longest row; two data ranks pad their slices to one width.
  CliRun e2 = run_cli_mpi(2, "eval --model " + (out / "model").string() + " --validation-file " + dev +
                                 " --max-seq-length 64 --mesh data=2");
  ASSERT_EQ(e2.code, 0) << e2.out;
  EXPECT_EQ(eval_output(e2)["eval_accuracy"], results["eval_accuracy"]);
#endif

  // A class the training rows do not have: an error naming file and line, before anything
  // is written.
  const std::string bad = write("bad.jsonl", jsonl + json{{"sentence", "meh"}, {"label", "neutral"}}.dump() + "\n");
  CliRun b = run_cli(common + "--validation_file " + bad + " --output_dir " + (dir_ / "bad_run").string());
  EXPECT_NE(b.code, 0);
  EXPECT_NE(b.out.find("bad.jsonl:65: label 'neutral' is not one of the classes negative, positive"), std::string::npos)
      << b.out;
  EXPECT_FALSE(fs::exists(dir_ / "bad_run" / "model"));
  // --train_file without --validation_file, or beside --task, is refused by the parser.
  EXPECT_NE(run_cli(common + "--output_dir " + (dir_ / "x").string()).code, 0);
  EXPECT_NE(run_cli(common + "--validation_file " + dev + " --task rte --data-dir " + kGlue).code, 0);
}

TEST_F(GlueCustomE2E, LoraOnAPretrainedBertSavesAPeftClassifierAdapter) {
  const fs::path out = dir_ / "mrpc";
  CliRun r = run_cli("glue --task_name mrpc --model_name_or_path " + kTinyBert + " --data-dir " + kGlue +
                     " --max-train-samples 64 --max-eval-samples 32 --num_train_epochs 2 --max_seq_length 64 "
                     "--learning_rate 1e-2 --lora-rank 4 --lora-alpha 8 --output_dir " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const json adapter = read_json(out / "adapter" / "adapter_config.json");
  EXPECT_EQ(adapter["peft_type"], "LORA");
  EXPECT_EQ(adapter["task_type"], "SEQ_CLS");
  EXPECT_EQ(adapter["r"], 4);
  EXPECT_EQ(adapter["modules_to_save"], (json{"classifier", "pooler"}));
  EXPECT_EQ(adapter["base_model_name_or_path"], kTinyBert);
  // PEFT's keys: the adapters, and the fully trained head under its plain path.
  Params tensors = io::load_safetensors((out / "adapter" / "adapter_model.safetensors").string());
  for (const char* key : {"base_model.model.classifier.weight", "base_model.model.classifier.bias",
                          "base_model.model.bert.pooler.dense.weight",
                          "base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight",
                          "base_model.model.bert.encoder.layer.0.output.dense.lora_B.weight"})
    EXPECT_TRUE(tensors.contains(key)) << key;
  EXPECT_EQ(tensors["base_model.model.classifier.weight"].shape(), Shape({2, 4}));
  for (const auto& [key, v] : tensors)
    EXPECT_TRUE(key.find("lora_") != std::string::npos || key.find(".pooler.") != std::string::npos ||
                key.find("classifier.") != std::string::npos)
        << "unexpected key " << key;
  // The adapter applied to the masked-LM base (loaded as a classifier with the adapter's
  // head) scores exactly as the merged export and as the run's last evaluation.
  const std::string eval = " --task mrpc --data-dir " + kGlue + " --max-seq-length 64 --max-eval-samples 32";
  CliRun a = run_cli("eval --model " + kTinyBert + " --adapter " + (out / "adapter").string() + eval);
  CliRun m = run_cli("eval --model " + (out / "model").string() + eval);
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(m.code, 0) << m.out;
  const size_t replaced = a.out.find("the adapter's trained modules replace the model's [");
  ASSERT_NE(replaced, std::string::npos) << a.out;
  const std::string list = a.out.substr(replaced, a.out.find('\n', replaced) - replaced);
  for (const char* p : {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias"})
    EXPECT_NE(list.find(p), std::string::npos) << list;
  const json results = read_json(out / "eval_results.json");
  EXPECT_EQ(eval_output(a)["eval_f1"], eval_output(m)["eval_f1"]);
  EXPECT_EQ(eval_output(a)["eval_accuracy"], results["eval_accuracy"]);
  EXPECT_EQ(eval_output(m)["eval_accuracy"], results["eval_accuracy"]);
  std::cout << "  LoRA mrpc: eval accuracy " << results["eval_accuracy"] << ", adapter on base "
            << eval_output(a)["eval_accuracy"] << ", merged " << eval_output(m)["eval_accuracy"] << "\n";

  // A SEQ_CLS adapter without its head would leave a random classifier: refused.
  fs::create_directories(dir_ / "headless");
  fs::copy_file(out / "adapter" / "adapter_config.json", dir_ / "headless" / "adapter_config.json");
  Params lora_only;
  for (const auto& [key, v] : tensors)
    if (key.find("lora_") != std::string::npos) lora_only.set(key, v);
  io::save_safetensors((dir_ / "headless" / "adapter_model.safetensors").string(), lora_only, {});
  CliRun h = run_cli("eval --model " + kTinyBert + " --adapter " + (dir_ / "headless").string() + eval);
  EXPECT_NE(h.code, 0);
  EXPECT_NE(h.out.find("needs its classifier 'base_model.model.classifier.weight'"), std::string::npos) << h.out;
}


// The rows are tokenized once per run before training, cached beside the data: a second run
// reads the cache and trains identically; another length or edited rows tokenize anew;
// --no-token-cache writes none.
TEST_F(GlueCustomE2E, TokenCacheIsReusedAndKeyedByWhatTheTokensDependOn) {
  std::string csv = "sentence,label\n", tsv;
  for (const auto& [text, label] : sst2("train", 96)) {
    std::string quoted;
    for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    csv += "\"" + quoted + "\"," + label + "\n";
  }
  std::string dev = "sentence,label\n";
  for (const auto& [text, label] : sst2("dev", 32)) {
    std::string quoted;
    for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    dev += "\"" + quoted + "\"," + label + "\n";
  }
  const std::string train = write("train.csv", csv), valid = write("dev.csv", dev);
  auto run = [&](const std::string& name, const std::string& extra, int length = 48) {
    CliRun r = run_cli("glue --config small --tokenizer " + kVocab + " --max_seq_length " + std::to_string(length) + " --num_train_epochs 1 "
                       "--per_device_train_batch_size 16 --train_file " + train + " --validation_file " + valid +
                       " --output_dir " + (dir_ / name).string() + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    return r.out;
  };
  const std::string first = run("a", "");
  EXPECT_NE(first.find("128 rows tokenized in"), std::string::npos) << first;
  const fs::path cache = dir_ / ".meshtrain_cache";
  ASSERT_TRUE(fs::is_directory(cache));
  auto files = [&] { return std::distance(fs::directory_iterator(cache), fs::directory_iterator{}); };
  EXPECT_EQ(files(), 2);  // train and eval
  const std::string second = run("b", "");
  EXPECT_NE(second.find("128 rows read from the token cache"), std::string::npos) << second;
  EXPECT_EQ(train_losses(dir_ / "a"), train_losses(dir_ / "b"));
  EXPECT_EQ(read_json(dir_ / "a" / "eval_results.json")["eval_accuracy"], read_json(dir_ / "b" / "eval_results.json")["eval_accuracy"]);
  EXPECT_NE(run("c", "", 32).find("128 rows tokenized in"), std::string::npos);
  EXPECT_EQ(files(), 4);
  write("train.csv", csv + "\"one more row\",1\n");  // edited data: a new key
  EXPECT_NE(run("d", "").find("129 rows tokenized in"), std::string::npos);
  const std::string off = run("e", " --no-token-cache");
  EXPECT_NE(off.find("tokenized in"), std::string::npos);
  EXPECT_NE(off.find("(no cache)"), std::string::npos) << off;
  EXPECT_EQ(files(), 5);
}

}  // namespace
}  // namespace mt::testing
