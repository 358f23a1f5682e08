#pragma once
// What `glue` and `eval` share for GLUE: a BERT sequence classifier (pretrained or from a
// small config), fixed-length pair tokenization, the loss (cross-entropy, or MSE for STS-B)
// and dev-set predictions scored by the task's metrics.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/dataset.h"
#include "meshtrain/data/glue.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/tokenizers/tokenizer.h"
#include "meshtrain/train/deployer.h"
#include "meshtrain/train/predictor.h"
#include "meshtrain/train/trainer.h"

namespace mt::cli {

// The metric the best checkpoint is chosen by: matthews_correlation (CoLA), pearson
// (STS-B), f1 (MRPC, QQP), accuracy otherwise.
std::string glue_primary_metric(const data::GlueTask& task);

// A BERT classifier config.json for `task`: the built-in small size ("small": hidden 128,
// 2 layers, 2 heads) or a JSON file, sized for the tokenizer's vocabulary.
nlohmann::json small_bert_config(const std::string& config, const data::GlueTask& task, int64_t vocab_size,
                                 int64_t max_seq_length);

// Sets `tok` to truncate and pad (with [PAD]) every encoding to max_len, as glue_collate needs.
void glue_fixed_length(tokenizers::Tokenizer& tok, int64_t max_len);

// Rows and positions of the batches a collate made so far (its loader threads add to them):
// how much padding a run computed on.
struct CollatedLengths {
  std::atomic<int64_t> rows{0}, positions{0};
  double mean() const { return rows ? double(positions) / double(rows) : 0.0; }
};

// Tokenizes {"text_a", ["text_b",] "label"} examples to max_len (truncated, padded):
// input_ids, token_type_ids, attention_mask, labels (i64, or f32 for regression). Examples
// tokenized ahead (glue_token_cache.h) bring their ids and are not tokenized again.
// pad_multiple 0: every batch is max_len long (run_flax_glue; HF run_glue's default
// --pad_to_max_length); otherwise each batch is cut to its longest row rounded up to a
// multiple of pad_multiple (at most max_len), as HF's DataCollatorWithPadding pads: the
// positions cut held padding only, which the attention mask hides, so the results are the
// same up to rounding, for fewer positions (dropout's masks, drawn per flat position, then
// fall elsewhere: the same distribution, other draws). `lengths` (optional) counts what was collated.
train::CollateFn glue_collate(std::shared_ptr<const tokenizers::Tokenizer> tok, const data::GlueTask& task,
                              int64_t max_len, int64_t pad_multiple = 0,
                              std::shared_ptr<CollatedLengths> lengths = nullptr);
// The fields glue_collate pads to a batch's longest row, with their pad values (the
// tokenizer's pad id, type 0, mask 0): for Trainer/Predictor::set_padded_fields.
std::vector<train::PaddedFields> glue_padded_fields(const tokenizers::Tokenizer& tok);
train::LossFn glue_loss(std::shared_ptr<const models::PretrainedModel> model, const data::GlueTask& task);

// The predictor of the task's labels (class ids or scores, as doubles); `graphs`: whether its
// step is captured (--cuda-graphs). It holds `deployer` and `model`: keep them alive.
train::Predictor<double> glue_predictor(train::Deployer& deployer, const models::PretrainedModel& model,
                                        const data::GlueTask& task, const train::CollateFn& collate,
                                        train::CudaGraphs graphs = train::CudaGraphs::automatic);
// The task's metrics of `predictions` against `dataset`'s labels.
std::map<std::string, double> glue_scores(const data::GlueTask& task, const std::vector<double>& predictions,
                                          const data::Dataset& dataset);
// Predictions on `dataset` and the task's metrics; `padded`: the fields a collate that cuts
// batches to their longest row names (glue_padded_fields), so that data ranks agree.
std::map<std::string, double> glue_evaluate(train::Deployer& deployer, const models::PretrainedModel& model,
                                            const Params& params, const data::GlueTask& task,
                                            const train::CollateFn& collate, std::shared_ptr<const data::Dataset> dataset,
                                            int64_t per_device_batch_size,
                                            const std::vector<train::PaddedFields>& padded = {});

}  // namespace mt::cli
