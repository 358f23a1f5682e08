#include "apps/meshtrain/lm_setup.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "apps/meshtrain/flag_checks.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/documents.h"
#include "meshtrain/data/lm_dataset.h"
#include "meshtrain/data/token_shards.h"
#include "meshtrain/distributed/communicator.h"
#include "meshtrain/io/json.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/models/user_config.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/tokenizers/byte_tokenizer.h"
#include "meshtrain/train/row_padding.h"

namespace mt::cli {

using json = nlohmann::json;

void add_lm_data_flags(CLI::App* cmd, LmDataFlags& f) {
  cmd->add_option("--data", f.data,
                  "text file or directory (documents split on '%' lines (fortune files) or <|endoftext|>), or a prepare-data token-shard directory")
      ->capture_default_str();
  cmd->add_option("--tokenizer", f.tokenizer,
                  "'bytes' (256 byte ids + <|endoftext|>), or a tokenizer.json / vocab.json / vocab.txt / .model / directory")
      ->capture_default_str();
  cmd->add_option("--seq-len", f.seq_len, "tokens per training sequence (the model's context)")
      ->capture_default_str()
      ->check(integer_range(2, 1 << 20));
  cmd->add_flag("--pad-documents", f.pad_documents,
                "one document per sequence, truncated or padded (padding is not a target), instead of packing");
}

std::shared_ptr<tokenizers::Tokenizer> tokenizer_into(const std::string& spec, const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (dist::world().rank() == 0) {
    // Another run's tokenizer files would shadow this one's (load_tokenizer looks for
    // tokenizer.json first): the folder keeps only this tokenizer. Files that are the
    // source itself (--tokenizer <output>/model) stay.
    // (A bare file name's folder is the working directory: absolute() first, since its
    // parent_path() is empty and equivalent() fails on an empty path.)
    std::error_code ec;
    const fs::path source_dir = fs::is_directory(spec) ? fs::path(spec) : fs::absolute(spec).parent_path();
    const bool in_place = fs::exists(spec) && fs::exists(model_dir) && fs::equivalent(source_dir, model_dir, ec);
    if (!in_place)
      for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                               "merges.txt", "encoder.json", "vocab.bpe", "spiece.model", "tokenizer.model",
                               "sentencepiece.bpe.model"})
        fs::remove(fs::path(model_dir) / name);
    if (spec == "bytes") tokenizers::write_byte_tokenizer(model_dir);
    else tokenizers::copy_tokenizer_files(spec, model_dir);
  }
  dist::world().barrier();
  return tokenizers::load_tokenizer(model_dir);
}

std::optional<int64_t> end_of_text_id(const tokenizers::Tokenizer& tok) {
  for (const char* t : {"<|endoftext|>", "</s>", "[SEP]"})
    if (auto id = tok.token_to_id(t)) return *id;
  return std::nullopt;
}

namespace {

// The held-out tail: the last `fraction` of `all`'s sequences.
void hold_out_tail(LmCorpus& c, std::shared_ptr<const data::Dataset> all, double fraction) {
  const int64_t n_eval = fraction > 0 ? std::max<int64_t>(1, int64_t(double(all->size()) * fraction)) : 0;
  c.dataset = n_eval > 0 ? std::make_shared<data::SubsetDataset>(all, 0, all->size() - n_eval) : all;
  if (n_eval > 0) {
    c.eval_dataset = std::make_shared<data::SubsetDataset>(all, all->size() - n_eval, all->size());
    c.held_out = "the last " + std::to_string(n_eval) + " sequences";
  }
}

// Fewer held-out documents than this: the tail instead (a handful of documents would make
// a noisy eval of an arbitrary few texts).
constexpr double kMinHeldOutDocuments = 20;

}  // namespace

LmCorpus make_lm_corpus(const LmDataFlags& f, std::shared_ptr<tokenizers::Tokenizer> tok, double eval_fraction) {
  LmCorpus c;
  c.tokenizer = tok;
  c.eos_id = end_of_text_id(*tok);
  if (data::is_token_shard_dir(f.data)) {
    // Tokenized by prepare-data: memory-mapped, read a sequence at a time.
    MT_CHECK(!f.pad_documents, "[pretrain] --pad-documents needs text; ", f.data, " holds token shards (packed)");
    auto ds = std::make_shared<data::TokenShardDataset>(f.data, f.seq_len);
    MT_CHECK(ds->vocab_size() == tok->vocab_size(), "[pretrain] ", f.data, " was tokenized with a vocabulary of ",
             ds->vocab_size(), " ids, the tokenizer has ", tok->vocab_size(), " (leave --tokenizer out to use the shards' own)");
    c.num_tokens = ds->num_tokens();
    hold_out_tail(c, ds, eval_fraction);
    return c;
  }
  std::vector<std::string> docs = data::read_documents(f.data);
  std::vector<std::string> eval_docs;
  if (eval_fraction > 0 && double(docs.size()) * eval_fraction >= kMinHeldOutDocuments) {
    const size_t stride = size_t(std::max(2.0, std::round(1.0 / eval_fraction)));
    std::vector<std::string> train_docs;
    for (size_t i = 0; i < docs.size(); ++i) (i % stride == stride - 1 ? eval_docs : train_docs).push_back(std::move(docs[i]));
    docs = std::move(train_docs);
    c.held_out = "1 in " + std::to_string(stride) + " documents, " + std::to_string(eval_docs.size()) + " of them";
  }
  data::TokenizeFn tokenize = [tok](const std::string& text) {
    tokenizers::Encoding e = tok->encode(text, false);
    return std::vector<int64_t>(e.ids.begin(), e.ids.end());
  };
  auto sequences = [&](const std::vector<std::string>& texts) -> std::pair<std::shared_ptr<const data::Dataset>, int64_t> {
    if (f.pad_documents) {
      data::DocumentDatasetOptions o;
      o.max_len = f.seq_len + 1;
      o.pad_id = c.eos_id.value_or(0);
      o.eos_id = c.eos_id;
      auto ds = std::make_shared<data::DocumentDataset>(texts, tokenize, o);
      return {ds, ds->size() * o.max_len};
    }
    data::PackedDatasetOptions o;
    o.seq_len = f.seq_len;
    o.separator_id = c.eos_id;
    auto ds = std::make_shared<data::PackedDataset>(texts, tokenize, o);
    return {ds, ds->num_tokens()};
  };
  auto [all, tokens] = sequences(docs);
  c.num_tokens = tokens;
  if (eval_docs.empty()) {
    hold_out_tail(c, all, eval_fraction);
    return c;
  }
  c.dataset = all;
  auto [held, held_tokens] = sequences(eval_docs);
  c.eval_dataset = held;
  c.num_tokens += held_tokens;
  return c;
}

LmCorpus load_lm_corpus(const LmDataFlags& f, const std::string& model_dir, double eval_fraction) {
  return make_lm_corpus(f, tokenizer_into(f.tokenizer, model_dir), eval_fraction);
}

json decoder_config(const std::string& model_type, const std::string& config_file, int64_t vocab_size, int64_t seq_len,
                    std::optional<int64_t> eos_id) {
  const int64_t vocab = (vocab_size + 63) / 64 * 64;
  const models::ModelSpec& spec = models::model_spec(model_type);
  MT_CHECK(spec.kind == models::ModelKind::decoder && spec.small_config != nullptr, "[pretrain] model '", model_type, "' is not a decoder (use ",
           models::model_types_text(models::ModelKind::decoder), ")");
  json c = spec.small_config(vocab, seq_len, eos_id.value_or(0));
  if (!config_file.empty()) {
    json user = io::read_json_file(config_file);
    MT_CHECK(user.is_object(), "[pretrain] ", config_file, ": a config must be a JSON object");
    MT_CHECK(!user.contains("model_type") || user["model_type"] == model_type, "[pretrain] ", config_file,
             ": model_type ", user.value("model_type", json()).dump(), " contradicts --model ", model_type);
    c = models::merge_user_config(spec, std::move(c), user, config_file, "pretrain");
  }
  MT_CHECK(c["vocab_size"].get<int64_t>() >= vocab_size, "[pretrain] vocab_size ", c["vocab_size"].get<int64_t>(),
           " is smaller than the tokenizer's ", vocab_size, " ids");
  return c;
}

train::CollateFn lm_collate(int64_t pad_multiple) {
  MT_CHECK(pad_multiple >= 0, "[collate] pad multiple ", pad_multiple, " is negative");
  return [pad_multiple](const std::vector<data::Example>& examples) {
    const int64_t n = int64_t(examples.size());
    const int64_t t = int64_t(examples.at(0).tokens("tokens").size()) - 1;
    std::vector<int64_t> ids, labels;
    ids.reserve(size_t(n * t));
    labels.reserve(size_t(n * t));
    for (const data::Example& e : examples) {
      const std::vector<int64_t>& tok = e.tokens("tokens");
      MT_CHECK(int64_t(tok.size()) == t + 1, "[collate] sequences of different lengths: ", tok.size(), " and ", t + 1);
      ids.insert(ids.end(), tok.begin(), tok.end() - 1);
      if (e.contains("targets")) {  // examples that say which tokens are targets (finetune's prompts are not)
        const std::vector<int64_t>& tgt = e.tokens("targets");
        MT_CHECK(tgt.size() == tok.size(), "[collate] ", tgt.size(), " targets for ", tok.size(), " tokens");
        labels.insert(labels.end(), tgt.begin() + 1, tgt.end());
        continue;
      }
      // Padded documents: a position is a target only while the next token is real.
      const int64_t real = e.contains("length") ? e.as_int("length") : t + 1;
      for (int64_t i = 1; i <= t; ++i) labels.push_back(i < real ? tok[size_t(i)] : -100);
    }
    int64_t width = t;
    if (pad_multiple > 0) {  // cut after the batch's last target
      width = train::columns_in_use(labels, n, t, -100, pad_multiple);
      train::keep_columns(ids, n, t, width);
      train::keep_columns(labels, n, t, width);
    }
    return train::Batch{{"input_ids", Array::from_vector(ids, {n, width})},
                        {"labels", Array::from_vector(labels, {n, width})}};
  };
}

std::vector<train::PaddedFields> lm_padded_fields() { return {{{"input_ids", 0.0}, {"labels", -100.0}}}; }

train::LossFn lm_loss(std::shared_ptr<const models::PretrainedModel> model) {
  return [model](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
    models::DecoderInputs in;
    in.input_ids = b["input_ids"];
    return model->decoder_loss(p, in, b["labels"], key, training);
  };
}

std::string sample_text(const models::PretrainedModel& model, const tokenizers::Tokenizer& tok, const std::string& prompt,
                        int64_t new_tokens, double temperature, int64_t top_k, uint64_t seed) {
  tokenizers::Encoding e = tok.encode(prompt, false);
  std::vector<int64_t> ids(e.ids.begin(), e.ids.end());
  if (ids.empty()) ids.push_back(end_of_text_id(tok).value_or(0));
  models::GenerationConfig g;
  g.max_new_tokens = new_tokens;
  g.temperature = temperature;
  g.top_k = top_k;
  g.seed = seed;
  models::CausalLm lm = model.causal_lm();
  // A sample ends at the end of its document: the tokenizer's end-of-text or the model's own.
  g.stop_tokens = lm.stop_tokens;
  if (auto eot = end_of_text_id(tok)) g.stop_tokens.push_back(*eot);
  models::GenerationResult r = models::generate(models::restrict_vocab(lm, std::min(lm.vocab_size, tok.vocab_size())), {ids}, g);
  std::vector<int32_t> all(ids.begin(), ids.end());
  all.insert(all.end(), r.tokens[0].begin(), r.tokens[0].end());
  return tok.decode(all, true);
}

}  // namespace mt::cli
