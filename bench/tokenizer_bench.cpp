// Tokenizer throughput: our BERT (WordPiece) and GPT-2 (byte-level BPE) tokenizers on Tiny
// Shakespeare + every GLUE sentence, one thread and batched on all cores, side by side with
// Hugging Face `tokenizers` (PyPI, bench/tokenizers_bench.py in the project's .venv) on the
// same texts.
//   tokenizer_bench [--repeats N] [--no-hf]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "meshtrain/tokenizers/tokenizer.h"
#include "tests/support/tokenizer_inputs.h"

namespace {

using namespace mt::tokenizers;
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;
constexpr size_t kBatch = 4096;  // texts per encode_batch call (the HF side uses the same)

struct Measure {
  size_t tokens = 0;
  double seconds = 0;
  double rate() const { return seconds > 0 ? double(tokens) / seconds : 0; }
};

template <class Fn>
Measure best_of(int repeats, Fn fn) {
  Measure best;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clk::now();
    const size_t tokens = fn();
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    if (r == 0 || s < best.seconds) best = {tokens, s};
  }
  return best;
}

// Runs the Hugging Face side; nullopt when the project's .venv (scripts/install-python-deps.sh)
// is missing.
std::optional<Measure> hf_measure(const std::string& tokenizer_json, const std::string& texts, int repeats,
                                  bool single_thread) {
  const std::string source = MT_SOURCE_DIR, python = source + "/.venv/bin/python3";
  if (!fs::exists(source + "/.venv/tokenizers-oracle/tokenizers")) return std::nullopt;
  const std::string cmd = std::string(single_thread ? "TOKENIZERS_PARALLELISM=false " : "") + python + " " + source +
                          "/bench/tokenizers_bench.py " + tokenizer_json + " " + texts + " " + std::to_string(repeats);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (pclose(p) != 0 || out.empty()) return std::nullopt;
  const auto j = nlohmann::json::parse(out);
  return Measure{j.at("tokens").get<size_t>(), j.at("seconds").get<double>()};
}

std::string rate_str(const std::optional<Measure>& m) {
  if (!m) return "n/a";
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << m->rate() / 1e6 << " M/s";
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 3;
  bool hf = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else if (a == "--no-hf") hf = false;
    else {
      std::cerr << "usage: tokenizer_bench [--repeats N] [--no-hf]\n";
      return 2;
    }
  }
  const std::string data = MT_DATA_DIR;
  std::vector<std::string> texts;
  for (const auto& x : mt::test::glue_inputs(data + "/glue")) {
    texts.push_back(x.a);
    if (x.b) texts.push_back(*x.b);
  }
  for (auto& x : mt::test::text_lines(data + "/text/tinyshakespeare.txt")) texts.push_back(std::move(x.a));
  size_t bytes = 0;
  for (const auto& t : texts) bytes += t.size();

  char tmpl[] = "/tmp/mt_tok_bench_XXXXXX";
  const fs::path dir = mkdtemp(tmpl);
  const std::string texts_path = (dir / "texts.jsonl").string();
  {
    std::ofstream out(texts_path, std::ios::binary);
    for (const auto& t : texts) out << nlohmann::json(t).dump() << '\n';
  }
  std::cout << "tokenizer_bench: " << texts.size() << " texts (GLUE sentences + Tiny Shakespeare lines), "
            << bytes / 1e6 << " MB; best of " << repeats << "; " << omp_get_max_threads()
            << " threads for batch (" << kBatch << " texts per call); tokens include [CLS]/[SEP]\n\n";
  std::cout << std::left << std::setw(28) << "tokenizer" << std::setw(12) << "tokens" << std::setw(16)
            << "ours 1 thread" << std::setw(16) << "ours batch" << std::setw(16) << "HF 1 thread" << std::setw(16)
            << "HF batch" << "\n";
  const std::vector<std::pair<std::string, std::string>> configs = {
      {"bert-base-uncased", data + "/tokenizers/bert-base-uncased-tokenizer.json"},
      {"gpt2", data + "/models/hf-tiny-gpt2/tokenizer.json"},
  };
  for (const auto& [name, path] : configs) {
    auto tok = load_tokenizer(path);
    const Measure single = best_of(repeats, [&] {
      size_t n = 0;
      for (const auto& t : texts) n += tok->encode(t).size();
      return n;
    });
    // Batches of kBatch texts, as a data loader would feed them.
    const Measure batch = best_of(repeats, [&] {
      size_t n = 0;
      for (size_t s = 0; s < texts.size(); s += kBatch) {
        const std::span<const std::string> chunk(texts.data() + s, std::min(kBatch, texts.size() - s));
        for (const auto& e : tok->encode_batch(chunk)) n += e.size();
      }
      return n;
    });
    std::optional<Measure> hf1, hfb;
    if (hf) {
      hf1 = hf_measure(path, texts_path, repeats, true);
      hfb = hf_measure(path, texts_path, repeats, false);
    }
    std::cout << std::left << std::setw(28) << name << std::setw(12) << single.tokens << std::setw(16)
              << rate_str(single) << std::setw(16) << rate_str(batch) << std::setw(16) << rate_str(hf1)
              << std::setw(16) << rate_str(hfb) << "\n";
    if (hf1 && hf1->tokens != single.tokens)
      std::cout << "  note: token counts differ (ours " << single.tokens << ", HF " << hf1->tokens << ")\n";
  }
  fs::remove_all(dir);
  return 0;
}
