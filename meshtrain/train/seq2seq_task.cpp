#include "meshtrain/train/seq2seq_task.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/distributed/collective_ops.h"
#include "meshtrain/distributed/spmd.h"
#include "meshtrain/models/seq2seq_generate.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/tokenizers/tokenizer.h"

namespace mt::train {

std::vector<int64_t> seq2seq_ids(const tokenizers::Tokenizer& tok, const std::string& text, int64_t max_len,
                                 int64_t eos_id) {
  MT_CHECK(max_len >= 2, "[seq2seq] maximum length ", max_len, " leaves no room for a token and the end token");
  const tokenizers::Encoding e = tok.encode(text, true);
  std::vector<int64_t> ids(e.ids.begin(), e.ids.end());
  if (!ids.empty() && ids.back() == eos_id) ids.pop_back();
  if (int64_t(ids.size()) > max_len - 1) ids.resize(size_t(max_len - 1));
  ids.push_back(eos_id);
  return ids;
}

data::Example seq2seq_example(const tokenizers::Tokenizer& tok, const std::string& source, const std::string& target,
                              const Seq2SeqTokens& t) {
  return data::Example{{"source_ids", seq2seq_ids(tok, t.source_prefix + source, t.max_source_length, t.eos_id)},
                       {"labels", seq2seq_ids(tok, target, t.max_target_length, t.eos_id)}};
}

CollateFn seq2seq_collate(const Seq2SeqTokens& t) {
  return [t](const std::vector<data::Example>& rows) {
    MT_CHECK(!rows.empty(), "[seq2seq] empty batch");
    size_t s = 0, n = 0;
    for (const auto& r : rows) s = std::max(s, r.tokens("source_ids").size()), n = std::max(n, r.tokens("labels").size());
    if (t.pad_to_max_length) {
      MT_CHECK(s <= size_t(t.max_source_length) && n <= size_t(t.max_target_length), "[seq2seq] a row of ", s,
               " source / ", n, " target tokens exceeds max_source_length ", t.max_source_length,
               " / max_target_length ", t.max_target_length);
      s = size_t(t.max_source_length), n = size_t(t.max_target_length);
    }
    const int64_t b = int64_t(rows.size());
    std::vector<int64_t> ids(size_t(b) * s, t.pad_id), mask(size_t(b) * s, 0), labels(size_t(b) * n, -100);
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& src = rows[i].tokens("source_ids");
      const auto& tgt = rows[i].tokens("labels");
      std::copy(src.begin(), src.end(), ids.begin() + long(i * s));
      std::fill_n(mask.begin() + long(i * s), src.size(), 1);
      std::copy(tgt.begin(), tgt.end(), labels.begin() + long(i * n));
    }
    Batch out;
    Array label_array = Array::from_vector(labels, Shape{b, int64_t(n)});
    out.set("input_ids", Array::from_vector(ids, Shape{b, int64_t(s)}));
    out.set("attention_mask", Array::from_vector(mask, Shape{b, int64_t(s)}));
    out.set("decoder_input_ids", models::shift_right(labels, b, int64_t(n), t.decoder_start_id, t.pad_id));
    out.set("labels", label_array);
    return out;
  };
}

std::vector<PaddedFields> seq2seq_padded_fields(const Seq2SeqTokens& t) {
  const double pad = double(t.pad_id);
  return {{{"input_ids", pad}, {"attention_mask", 0.0}}, {{"decoder_input_ids", pad}, {"labels", -100.0}}};
}

LossFn seq2seq_loss_fn(std::shared_ptr<const models::PretrainedModel> model) {
  return [model](const Params& p, const Batch& b, const RngKey& key, bool train) {
    const models::Seq2SeqInputs in{.input_ids = b["input_ids"], .attention_mask = b["attention_mask"],
                                   .decoder_input_ids = b["decoder_input_ids"]};
    return model->seq2seq_loss(p, in, b["labels"], key, train);
  };
}

double token_accuracy(const std::vector<std::vector<int64_t>>& targets, const std::vector<std::vector<int64_t>>& predictions) {
  MT_CHECK(targets.size() == predictions.size(), "[seq2seq] ", targets.size(), " targets but ", predictions.size(),
           " predictions");
  int64_t right = 0, total = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto &t = targets[i], &p = predictions[i];
    for (size_t j = 0; j < std::min(t.size(), p.size()); ++j) right += t[j] == p[j];
    total += int64_t(std::max(t.size(), p.size()));
  }
  return total == 0 ? 1.0 : double(right) / double(total);
}

namespace {

// The global batch's sources as token lists, in example order. Each rank collated its own
// rows, padded to its own longest source, so the data shards' widths differ and the batch
// cannot be gathered as one array: each shard's rows are padded with -1 to the widest
// shard's width first, then gathered along the example dim.
std::vector<std::vector<int64_t>> gather_sources(const Array& ids, const Array& mask) {
  const dist::Sharding* s = dist::sharding_of(ids);
  const Array local_ids = s ? dist::local_view(ids) : ids, local_mask = s ? dist::local_view(mask) : mask;
  const int64_t rows = local_ids.dim(0), width = local_ids.dim(1);
  int64_t widest = width;
  std::string axis;
  if (s && s->spec.ndim() > 0 && !s->spec.dims[0].empty()) {
    MT_CHECK(s->spec.dims[0].size() == 1, "[seq2seq] sources split over several axes (", s->spec.str(), ")");
    axis = s->spec.dims[0][0];
    const Array widths = dist::all_gather(Array::from_vector(std::vector<int64_t>{width}, Shape{1}), s->mesh, axis, 0);
    for (int64_t w : widths.to_ints()) widest = std::max(widest, w);
  }
  const std::vector<int64_t> iv = local_ids.to_ints(), mv = local_mask.to_ints();
  std::vector<int64_t> padded(size_t(rows * widest), -1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j)
      if (mv[size_t(r * width + j)] != 0) padded[size_t(r * widest + j)] = iv[size_t(r * width + j)];
  Array all = Array::from_vector(padded, Shape{rows, widest});
  if (!axis.empty()) all = dist::all_gather(all, s->mesh, axis, 0);
  const std::vector<int64_t> av = all.to_ints();
  std::vector<std::vector<int64_t>> sources(static_cast<size_t>(all.dim(0)));
  for (int64_t r = 0; r < all.dim(0); ++r)
    for (int64_t j = 0; j < widest; ++j)
      if (av[size_t(r * widest + j)] >= 0) sources[size_t(r)].push_back(av[size_t(r * widest + j)]);
  return sources;
}

}  // namespace

Array pack_token_rows(const std::vector<std::vector<int64_t>>& rows, int64_t width) {
  const int64_t n = int64_t(rows.size());
  std::vector<int64_t> out(size_t(n * width), -1);
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK(int64_t(rows[size_t(i)].size()) <= width, "[predict] row ", i, " has ", rows[size_t(i)].size(),
             " tokens, more than ", width);
    std::copy(rows[size_t(i)].begin(), rows[size_t(i)].end(), out.begin() + i * width);
  }
  return Array::from_vector(out, Shape{n, width});
}

std::vector<std::vector<int64_t>> unpack_token_rows(const Array& packed) {
  const std::vector<int64_t> v = packed.to_ints();
  const int64_t n = packed.dim(0), width = packed.dim(1);
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < width && v[size_t(r * width + j)] >= 0; ++j) rows[size_t(r)].push_back(v[size_t(r * width + j)]);
  return rows;
}

PredFn seq2seq_predict_fn(std::shared_ptr<const models::PretrainedModel> model, models::GenerationConfig g,
                          int64_t vocab_limit) {
  return [model, g, vocab_limit](const Params& p, const Batch& b) {
    // Every rank generates the whole global batch with the (possibly sharded) weights: the
    // model's collectives need all ranks in step, and the tokens come out the same everywhere.
    std::vector<std::vector<int64_t>> sources = gather_sources(b["input_ids"], b["attention_mask"]);
    models::Seq2SeqLm lm = model->seq2seq_lm(p);
    for (auto& src : sources)
      if (src.empty()) src.push_back(lm.eos_token_id);  // the Predictor's padding rows
    if (vocab_limit > 0 && vocab_limit < lm.vocab_size) lm = models::restrict_vocab(lm, vocab_limit);
    Batch o;
    o.set("tokens", pack_token_rows(models::generate_seq2seq(lm, sources, g).tokens, g.max_new_tokens));
    return o;
  };
}

}  // namespace mt::train
