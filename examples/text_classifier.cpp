// Sentiment classification: a small BERT, initialized from scratch, trained on the first
// few thousand SST-2 sentences, then evaluated on the dev set. The program is the three
// functions meshtrain asks for — collate (examples -> arrays), loss, predict — and a main
// that hands them to the Trainer and the Predictor.
//
//   example_text_classifier [data_dir=../shared/data] [steps=300] [train_sentences=8000]
//                           [workdir=runs/text_classifier]
//
// Runs unchanged under `mpirun -np 2`: each process collates half of every batch.
#include <algorithm>
#include <map>
#include <numeric>

#include "meshtrain/meshtrain.h"
#include "meshtrain/data/glue.h"
#include "meshtrain/models/bert.h"

using namespace mt;

constexpr int64_t kMaxLen = 64;  // sentences are truncated to this many tokens

// [CLS] sentence [SEP], truncated to kMaxLen, each batch padded to its longest sentence
// (rounded up to 8), as HF's DataCollatorWithPadding pads.
train::Batch collate(const tokenizers::Tokenizer& tokenizer, const std::vector<data::Example>& examples) {
  std::vector<std::string> texts;
  std::vector<int64_t> ids, mask, labels;
  for (const data::Example& e : examples) {
    texts.push_back(e.str("text_a"));
    labels.push_back(e.as_int("label"));
  }
  for (const tokenizers::Encoding& enc : tokenizer.encode_batch(texts)) {
    ids.insert(ids.end(), enc.ids.begin(), enc.ids.end());
    mask.insert(mask.end(), enc.attention_mask.begin(), enc.attention_mask.end());
  }
  const int64_t n = int64_t(examples.size()), width = int64_t(ids.size()) / n;
  return {{"input_ids", Array::from_vector(ids, {n, width})},
          {"attention_mask", Array::from_vector(mask, {n, width})},
          {"labels", Array::from_vector(labels, {n})}};
}

// The fields collate pads to its batch's longest row, and their pad values: data-parallel
// ranks collate their own slices, and the Trainer pads them to the ranks' longest.
const std::vector<train::PaddedFields> kPaddedFields = {{{"input_ids", 0.0}, {"attention_mask", 0.0}}};

models::BertOutputs forward(const models::BertConfig& config, const Params& params, const train::Batch& batch,
                            const RngKey& dropout_key = {}, bool train = false) {
  models::BertInputs in{.input_ids = batch["input_ids"], .attention_mask = batch["attention_mask"]};
  return models::bert_apply(config, params, in, dropout_key, train);
}

int main(int argc, char** argv) {
  return dist::run_guarded([&] {
    const std::string data_dir = argc > 1 ? argv[1] : "../shared/data";
    const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 300;
    MT_CHECK(steps > 0, "steps must be positive, got ", steps);
    const int64_t train_sentences = argc > 3 ? std::stoll(argv[3]) : 8000;
    const std::string workdir = argc > 4 ? argv[4] : "runs/text_classifier";

    auto tokenizer = tokenizers::load_tokenizer(data_dir + "/tokenizers/bert-base-uncased-tokenizer.json");
    tokenizer->set_truncation(tokenizers::TruncationParams{.max_length = kMaxLen});
    tokenizer->set_padding(tokenizers::PaddingParams{.length = std::nullopt, .pad_to_multiple_of = 8});
    // SST-2 rows as {"text_a": sentence, "label": 0 negative / 1 positive}. The first rows of
    // train make the training set; the whole dev set measures accuracy.
    const data::GlueTask& sst2 = data::glue_task("sst2");
    std::vector<data::Example> train_rows = data::read_glue_split(data_dir + "/glue", sst2, "train");
    train_rows.resize(std::min<size_t>(train_rows.size(), size_t(train_sentences)));
    std::vector<data::Example> dev_rows = data::read_glue_split(data_dir + "/glue", sst2, "dev");
    std::vector<int64_t> dev_labels;
    for (const data::Example& e : dev_rows) dev_labels.push_back(e.as_int("label"));
    auto train_set = data::make_dataset(train_rows), dev_set = data::make_dataset(dev_rows);

    models::BertConfig config;  // BERT-base's vocabulary, a much smaller network
    config.vocab_size = tokenizer->vocab_size();
    config.hidden_size = 64;
    config.num_hidden_layers = 2;
    config.num_attention_heads = 2;
    config.intermediate_size = 128;
    config.max_position_embeddings = kMaxLen;
    config.num_labels = sst2.num_labels();
    config = config.with_head(models::BertHead::sequence_classification);  // + pooler + classifier

    train::DeployerOptions options;
    options.workdir = workdir;  // metrics.jsonl and TensorBoard events
    train::Deployer deployer(options);
    Params params = models::bert_init(config, deployer.init_key());
    auto collate_fn = [&](const std::vector<data::Example>& ex) { return collate(*tokenizer, ex); };
    // loss: dropout while training, none when the Trainer evaluates.
    auto loss_fn = [&](const Params& p, const train::Batch& batch, const RngKey& key, bool training) {
      return cross_entropy(forward(config, p, batch, key, training).logits, batch["labels"]);
    };
    auto lr = optim::warmup_linear_decay_schedule(1e-3, steps / 10, steps);
    train::Trainer trainer(deployer, collate_fn, loss_fn, params, optim::adamw(lr),
                           deployer.sharding_rules(params, models::bert_param_roles(config)));
    trainer.set_padded_fields(kPaddedFields);

    // predict: the most likely class of each sentence, returned in example order.
    train::Predictor<int64_t> predictor(
        deployer, collate_fn,
        [&](const Params& p, const train::Batch& batch) {
          return train::Batch{{"label", argmax(forward(config, p, batch).logits, -1)}};
        },
        [](const train::Batch& outputs) { return outputs["label"].to_ints(); });
    predictor.set_padded_fields(kPaddedFields);

    train::FitOptions fit;
    fit.per_device_batch_size = 32 / deployer.data_size();
    fit.epochs = 1000;  // max_steps ends the run
    fit.max_steps = steps;
    fit.learning_rate = lr;
    fit.save_last = false;
    // Evaluated after the last step: the dev loss, and accuracy from the Predictor.
    fit.eval_data = dev_set;
    fit.eval_every = steps;
    fit.eval_fn = [&](const Params& p) {
      return std::map<std::string, double>{{"accuracy", train::accuracy(predictor.predict(p, dev_set, 64), dev_labels)}};
    };
    train::FitResult result = trainer.fit(train_set, fit);
    const std::vector<double>& losses = result.losses;

    const size_t k = std::max<size_t>(1, losses.size() / 5);  // single steps are noisy: compare fifths
    const double first = std::accumulate(losses.begin(), losses.begin() + k, 0.0) / k,
                 last = std::accumulate(losses.end() - k, losses.end(), 0.0) / k;
    deployer.log("train loss " + std::to_string(first) + " -> " + std::to_string(last) + " (mean of the first and last " +
                 std::to_string(k) + " steps)");
    deployer.log("dev accuracy " + std::to_string(result.evals.back().at("accuracy")) + " on " +
                 std::to_string(dev_rows.size()) + " sentences, dev loss " + std::to_string(result.evals.back().at("eval_loss")));
    if (!(last < first)) deployer.log("error: the loss did not fall");
    return last < first ? 0 : 1;
  });
}
