#pragma once
// What the language-model commands (pretrain, eval) share: the corpus flags, a tokenizer
// kept beside the model, text cut into training sequences, default model sizes, and the
// collate / loss / sampling functions of a decoder.
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "meshtrain/data/dataset.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {

struct LmDataFlags {
  std::string data = "/usr/share/games/fortunes";
  std::string tokenizer = "bytes";
  int64_t seq_len = 128;
  bool pad_documents = false;  // one padded document per sequence instead of packing
};

void add_lm_data_flags(CLI::App* cmd, LmDataFlags& flags);

// The tokenizer named by --tokenizer ("bytes", or any file/directory load_tokenizer takes),
// with its files placed in `model_dir` by rank 0 so the saved model carries it.
std::shared_ptr<tokenizers::Tokenizer> tokenizer_into(const std::string& spec, const std::string& model_dir);

// The end-of-text id documents are separated by (<|endoftext|>, </s>), if the tokenizer has one.
std::optional<int64_t> end_of_text_id(const tokenizers::Tokenizer& tok);

struct LmCorpus {
  std::shared_ptr<tokenizers::Tokenizer> tokenizer;
  std::shared_ptr<const data::Dataset> dataset;  // examples {"tokens": seq_len + 1 ids[, "length"]}
  std::shared_ptr<const data::Dataset> eval_dataset;  // held out of `dataset`; null when none
  std::string held_out;  // how eval_dataset was chosen, for the log line
  int64_t num_tokens = 0;
  std::optional<int64_t> eos_id;
};

// Reads --data's documents and cuts them into sequences with `tokenizer`, holding out about
// `eval_fraction` of them for eval loss. A corpus of many documents (a folder of fortune
// files, documents separated by <|endoftext|>) holds out every (1/fraction)-th document, so
// eval samples every part of the corpus: the tail of a folder is its last file alone, one
// style of text that training never saw. One long text (Tiny Shakespeare) and token
// shards hold out their last sequences.
LmCorpus make_lm_corpus(const LmDataFlags& flags, std::shared_ptr<tokenizers::Tokenizer> tokenizer,
                        double eval_fraction = 0);
LmCorpus load_lm_corpus(const LmDataFlags& flags, const std::string& model_dir, double eval_fraction = 0);

// config.json content of a small `model_type` ("minigpt", "gpt2", "llama") for this
// vocabulary (rounded up to a multiple of 64 so vocab-parallel shards divide it) and
// context, with the keys of `config_file` (if any) on top.
nlohmann::json decoder_config(const std::string& model_type, const std::string& config_file, int64_t vocab_size,
                              int64_t seq_len, std::optional<int64_t> eos_id);

// {"input_ids", "labels"} from sequences of seq_len + 1 tokens: labels are the next tokens, or the
// next position's "targets" when examples carry them; -100 (padding, prompts) is no target.
// pad_multiple > 0: the batch is cut after its last target, rounded up to a multiple of
// pad_multiple (at most seq_len): in a causal decoder no earlier position sees the positions
// cut, and they hold no target, so the loss is the same up to rounding on fewer positions
// (dropout's masks, drawn per flat position, fall elsewhere).
train::CollateFn lm_collate(int64_t pad_multiple = 0);
// The fields lm_collate(pad_multiple > 0) cuts, with their pad values (ids 0, labels -100):
// for Trainer::set_padded_fields, so that data ranks pad their slices alike.
std::vector<train::PaddedFields> lm_padded_fields();
// Mean next-token cross-entropy of the decoder.
train::LossFn lm_loss(std::shared_ptr<const models::PretrainedModel> model);

// Prompt + sampled continuation, decoded (one process's computation: host params).
std::string sample_text(const models::PretrainedModel& model, const tokenizers::Tokenizer& tok, const std::string& prompt,
                        int64_t new_tokens, double temperature, int64_t top_k, uint64_t seed);

}  // namespace mt::cli
