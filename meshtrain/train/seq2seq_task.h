#pragma once
// The pieces of a sequence-to-sequence task (the Redco summarization pipeline) for any
// encoder-decoder of the registry: token rows from text pairs, the collate function
// (right-padded sources with their mask, targets shifted right behind the decoder start
// token, -100 on padded labels), the teacher-forced loss, and the beam-search predict
// function the Predictor runs on a mesh.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/example.h"
#include "meshtrain/models/generate.h"
#include "meshtrain/models/pretrained.h"
#include "meshtrain/train/predictor.h"
#include "meshtrain/train/trainer.h"

namespace mt::tokenizers {
class Tokenizer;
}

namespace mt::train {

struct Seq2SeqTokens {
  int64_t pad_id = 0, eos_id = 1, decoder_start_id = 0;
  int64_t max_source_length = 128, max_target_length = 64;
  std::string source_prefix;  // prepended to every source ("summarize: " for T5)
  // Every batch max_source_length x max_target_length wide, instead of its longest rows (data
  // ranks, which collate their slices apart, are padded alike by seq2seq_padded_fields).
  bool pad_to_max_length = false;
};

// The tokenizer's ids of `text` (its special-token template applied) truncated to
// max_len - 1 and ending with eos (appended unless the template already put it last).
std::vector<int64_t> seq2seq_ids(const tokenizers::Tokenizer& tok, const std::string& text, int64_t max_len,
                                 int64_t eos_id);

// One example {"source_ids", "labels"} (token lists) from a text pair.
data::Example seq2seq_example(const tokenizers::Tokenizer& tok, const std::string& source, const std::string& target,
                              const Seq2SeqTokens& t);

// Batch {input_ids (B, S), attention_mask (B, S), decoder_input_ids (B, T), labels (B, T)}.
CollateFn seq2seq_collate(const Seq2SeqTokens& t);
// The fields seq2seq_collate pads to the batch's longest rows, in their two length groups
// (sources: pad id, mask 0; targets: pad id, label -100): for Trainer/Predictor::set_padded_fields,
// so that data ranks whose slices came out of different lengths agree before a step.
std::vector<PaddedFields> seq2seq_padded_fields(const Seq2SeqTokens& t);

// Mean cross-entropy of the model's teacher-forced logits against the labels.
LossFn seq2seq_loss_fn(std::shared_ptr<const models::PretrainedModel> model);

// Token accuracy for tasks whose outputs are not prose (ids, codes, sorted lists): over all
// pairs, the tokens the prediction has right at their position, divided by the tokens of the
// longer of prediction and target (a missing or extra token counts as wrong). 1 when both are
// empty everywhere; the lists must pair up.
double token_accuracy(const std::vector<std::vector<int64_t>>& targets, const std::vector<std::vector<int64_t>>& predictions);

// Generated rows as a predict function returns them: (B, width) i64, -1 after each row's end;
// and back (what a Predictor's output function reads).
Array pack_token_rows(const std::vector<std::vector<int64_t>>& rows, int64_t width);
std::vector<std::vector<int64_t>> unpack_token_rows(const Array& packed);

// Generates for the batch's sources (beam search or greedy per `g`) with the parameters the
// Predictor passes: output "tokens" (B, max_new_tokens) i64, -1 after each row's end.
PredFn seq2seq_predict_fn(std::shared_ptr<const models::PretrainedModel> model, models::GenerationConfig g,
                          int64_t vocab_limit);

}  // namespace mt::train
