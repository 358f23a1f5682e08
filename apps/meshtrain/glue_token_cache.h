#pragma once
// GLUE rows tokenized once, before training, instead of in every batch of every epoch and
// every evaluation: the whole split in one parallel encode_batch, kept as flat fixed-length
// arrays (ids, token types, attention mask) beside the rows, and cached in a file next to the
// data so that a second run over the same rows with the same tokenizer and length reads it
// instead of tokenizing (issue 45: the seed's SST-2 job end to end).
//
// The cache file is named by a hash of everything the tokens depend on — the rows' texts,
// the tokenizer's files, the length and whether the task is of pairs — so another tokenizer,
// length or edited data never reads a stale one. Written atomically by rank 0 (the others
// wait and read it); a folder that cannot be written means no cache, with a note.
#include <memory>
#include <string>

#include "meshtrain/data/dataset.h"
#include "meshtrain/data/glue.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::cli {

struct TokenCacheReport {
  bool from_cache = false;
  std::string path;     // the cache file ("" when none)
  double seconds = 0;   // tokenizing or reading
};

// Where the cache of data in `data_dir` goes: `<data_dir>/.meshtrain_cache`, or, where that
// folder is read-only (a shared dataset: no write permission bit, even for root),
// `$XDG_CACHE_HOME/meshtrain/glue-tokens` (default `~/.cache`).
std::string token_cache_dir(const std::string& data_dir);

// `rows` ({"text_a", ["text_b",] "label"}) with "input_ids", "token_type_ids" and
// "attention_mask" (max_len ids each) added to every example. `tok` must truncate and pad to
// max_len (glue_fixed_length); `tokenizer_dir` holds its files (hashed into the key);
// `cache_dir` "" disables the file cache; `name` names the split in the file name.
std::shared_ptr<const data::Dataset> pretokenize_glue(std::shared_ptr<const data::Dataset> rows, const tokenizers::Tokenizer& tok,
                                                      const data::GlueTask& task, int64_t max_len,
                                                      const std::string& tokenizer_dir, const std::string& cache_dir,
                                                      const std::string& name, TokenCacheReport* report = nullptr);

}  // namespace mt::cli
