#include "apps/meshtrain/glue_setup.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
#include "meshtrain/models/bert.h"
#include "meshtrain/models/model_spec.h"
#include "meshtrain/models/user_config.h"
#include "meshtrain/ops/loss.h"
#include "meshtrain/ops/reduce.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/train/metrics.h"
#include "meshtrain/train/predictor.h"
#include "meshtrain/train/row_padding.h"

namespace mt::cli {

using json = nlohmann::json;

std::string glue_primary_metric(const data::GlueTask& task) {
  const std::string& t = task.metric_task();
  if (t == "cola") return "matthews_correlation";
  if (t == "stsb") return "pearson";
  if (t == "mrpc" || t == "qqp") return "f1";
  return "accuracy";
}

json small_bert_config(const std::string& config, const data::GlueTask& task, int64_t vocab_size, int64_t max_seq_length) {
  json c = {{"model_type", "bert"},
            {"architectures", {"BertForSequenceClassification"}},
            {"vocab_size", (vocab_size + 63) / 64 * 64},  // divisible by any model-axis size up to 64
            {"hidden_size", 128},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 2},
            {"intermediate_size", 512},
            {"max_position_embeddings", std::max<int64_t>(512, max_seq_length)},
            {"num_labels", task.num_labels()}};
  if (config != "small") {
    json user = io::read_json_file(config);
    MT_CHECK(user.is_object(), "[glue] ", config, ": a config must be a JSON object");
    const models::ModelSpec& bert = models::model_spec("bert");
    MT_CHECK(user.value("model_type", bert.model_type) == bert.model_type, "[glue] ", config, ": model_type ",
             user["model_type"].dump(), " is not bert (glue trains BERT classifiers)");
    c = models::merge_user_config(bert, std::move(c), user, config, "glue");
    c["architectures"] = {"BertForSequenceClassification"};
    c["num_labels"] = task.num_labels();
    c.erase("id2label");
  }
  MT_CHECK(c["vocab_size"].is_number_integer() && c["vocab_size"].get<int64_t>() >= vocab_size, "[glue] ", config,
           ": vocab_size ", c["vocab_size"].dump(), " is smaller than the tokenizer's ", vocab_size, " ids");
  return c;
}

void glue_fixed_length(tokenizers::Tokenizer& tok, int64_t max_len) {
  tok.set_truncation(tokenizers::TruncationParams{size_t(max_len)});
  tokenizers::PaddingParams pad;
  pad.length = size_t(max_len);
  if (auto id = tok.token_to_id("[PAD]")) pad.pad_id = *id;
  tok.set_padding(pad);
}

namespace {

void add_labels(train::Batch& b, const std::vector<data::Example>& examples, const data::GlueTask& task) {
  const int64_t n = int64_t(examples.size());
  if (task.is_regression()) {
    std::vector<float> labels;
    for (const auto& e : examples) labels.push_back(float(e.as_float("label")));
    b.set("labels", Array::from_vector(labels, {n}));
  } else {
    std::vector<int64_t> labels;
    for (const auto& e : examples) labels.push_back(e.as_int("label"));
    b.set("labels", Array::from_vector(labels, {n}));
  }
}

// n rows of ids, token types and mask, each `width` long, flattened.
struct Rows {
  int64_t n = 0, width = 0;
  std::vector<int64_t> ids, types, mask;
};

// Examples tokenized ahead (glue_token_cache.h) carry their ids.
Rows pretokenized_rows(const std::vector<data::Example>& examples, int64_t max_len) {
  Rows r{int64_t(examples.size()), max_len, {}, {}, {}};
  for (const data::Example& e : examples) {
    const std::vector<int64_t>& i = e.tokens("input_ids");
    MT_CHECK(int64_t(i.size()) == max_len, "[glue] a pretokenized row of ", i.size(), " ids, not ", max_len);
    r.ids.insert(r.ids.end(), i.begin(), i.end());
    const std::vector<int64_t>& t = e.tokens("token_type_ids");
    r.types.insert(r.types.end(), t.begin(), t.end());
    const std::vector<int64_t>& m = e.tokens("attention_mask");
    r.mask.insert(r.mask.end(), m.begin(), m.end());
  }
  return r;
}

Rows encoded_rows(const tokenizers::Tokenizer& tok, const std::vector<data::Example>& examples, const data::GlueTask& task) {
  std::vector<tokenizers::Encoding> enc;
  if (task.text_b.empty()) {
    std::vector<std::string> texts;
    for (const auto& e : examples) texts.push_back(e.str("text_a"));
    enc = tok.encode_batch(texts);
  } else {
    std::vector<std::pair<std::string, std::string>> pairs;
    for (const auto& e : examples) pairs.emplace_back(e.str("text_a"), e.str("text_b"));
    enc = tok.encode_batch(pairs);
  }
  Rows r{int64_t(examples.size()), int64_t(enc.at(0).ids.size()), {}, {}, {}};
  for (const auto& e : enc) {
    r.ids.insert(r.ids.end(), e.ids.begin(), e.ids.end());
    r.types.insert(r.types.end(), e.type_ids.begin(), e.type_ids.end());
    r.mask.insert(r.mask.end(), e.attention_mask.begin(), e.attention_mask.end());
  }
  return r;
}

// The rows cut after the longest one's last unmasked position, rounded up to `multiple` (the
// tokenizer pads on the right: everything after that position is padding).
void cut_to_longest(Rows& r, int64_t multiple) {
  const int64_t width = train::columns_in_use(r.mask, r.n, r.width, 0, multiple);
  for (std::vector<int64_t>* v : {&r.ids, &r.types, &r.mask}) train::keep_columns(*v, r.n, r.width, width);
  r.width = width;
}

}  // namespace

train::CollateFn glue_collate(std::shared_ptr<const tokenizers::Tokenizer> tok, const data::GlueTask& task,
                              int64_t max_len, int64_t pad_multiple, std::shared_ptr<CollatedLengths> lengths) {
  MT_CHECK(tok->truncation() && tok->padding() && tok->padding()->length == size_t(max_len),
           "[glue] the tokenizer must truncate and pad to ", max_len);
  MT_CHECK(pad_multiple >= 0, "[glue] pad multiple ", pad_multiple, " is negative");
  return [tok, task, max_len, pad_multiple, lengths](const std::vector<data::Example>& examples) {
    Rows r = !examples.empty() && examples[0].contains("input_ids") ? pretokenized_rows(examples, max_len)
                                                                    : encoded_rows(*tok, examples, task);
    if (pad_multiple > 0) cut_to_longest(r, pad_multiple);
    if (lengths) {
      lengths->rows += r.n;
      lengths->positions += r.n * r.width;
    }
    train::Batch b{{"input_ids", Array::from_vector(r.ids, {r.n, r.width})},
                   {"token_type_ids", Array::from_vector(r.types, {r.n, r.width})},
                   {"attention_mask", Array::from_vector(r.mask, {r.n, r.width})}};
    add_labels(b, examples, task);
    return b;
  };
}

std::vector<train::PaddedFields> glue_padded_fields(const tokenizers::Tokenizer& tok) {
  MT_CHECK(tok.padding(), "[glue] the tokenizer does not pad");
  return {{{"input_ids", double(tok.padding()->pad_id)}, {"token_type_ids", 0.0}, {"attention_mask", 0.0}}};
}

namespace {

Array glue_logits(const models::PretrainedModel& model, const Params& p, const train::Batch& b, const RngKey& key,
                  bool training) {
  models::BertInputs in;
  in.input_ids = b["input_ids"];
  in.token_type_ids = b["token_type_ids"];
  in.attention_mask = b["attention_mask"];
  return models::bert_apply(model.config.as<models::BertConfig>(), p, in, key, training).logits;
}

}  // namespace

train::LossFn glue_loss(std::shared_ptr<const models::PretrainedModel> model, const data::GlueTask& task) {
  const bool regression = task.is_regression();
  return [model, regression](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
    Array logits = glue_logits(*model, p, b, key, training);
    if (regression) return mse_loss(reshape(logits, {logits.dim(0)}), b["labels"]);
    return cross_entropy(logits, b["labels"]);
  };
}

train::Predictor<double> glue_predictor(train::Deployer& deployer, const models::PretrainedModel& model,
                                        const data::GlueTask& task, const train::CollateFn& collate, train::CudaGraphs graphs) {
  const bool regression = task.is_regression();
  train::Predictor<double> predictor(
      deployer, collate,
      [&model, regression](const Params& p, const train::Batch& b) {
        Array logits = glue_logits(model, p, b, RngKey{}, false);
        return train::Batch{{"prediction", regression ? reshape(logits, {logits.dim(0)}) : argmax(logits, -1)}};
      },
      [](const train::Batch& out) { return out["prediction"].to_doubles(); });
  predictor.set_cuda_graphs(graphs);
  return predictor;
}

std::map<std::string, double> glue_scores(const data::GlueTask& task, const std::vector<double>& predictions,
                                          const data::Dataset& dataset) {
  std::vector<double> labels;
  for (int64_t i = 0; i < dataset.size(); ++i) labels.push_back(dataset.get(i).as_float("label"));
  if (task.is_regression()) return train::glue_metrics(task.metric_task(), predictions, labels);
  std::vector<int64_t> p(predictions.begin(), predictions.end()), l(labels.begin(), labels.end());
  return train::glue_metrics(task.metric_task(), p, l);
}

std::map<std::string, double> glue_evaluate(train::Deployer& deployer, const models::PretrainedModel& model,
                                            const Params& params, const data::GlueTask& task,
                                            const train::CollateFn& collate, std::shared_ptr<const data::Dataset> dataset,
                                            int64_t per_device_batch_size,
                                            const std::vector<train::PaddedFields>& padded) {
  train::Predictor<double> predictor = glue_predictor(deployer, model, task, collate);
  if (!padded.empty()) predictor.set_padded_fields(padded);
  return glue_scores(task, predictor.predict(params, dataset, per_device_batch_size), *dataset);
}

}  // namespace mt::cli
