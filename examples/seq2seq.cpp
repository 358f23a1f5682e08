// Sequence to sequence, the Redco paper's complete example (its appendix) on a task small
// enough to learn from scratch in seconds: a small BART reads 3 to 5 distinct words and
// writes them in alphabetical order. The user's functions are collate (tokenize source and
// target), loss (teacher-forced cross-entropy) and predict (beam search); the Trainer and
// the Predictor run them on the Deployer's mesh. Held-out pairs are scored by ROUGE-L and
// exact match.
//
//   example_seq2seq [steps=300] [workdir=runs/seq2seq]
//
// Runs unchanged under `mpirun -np 2` (data parallel: each process collates half of every
// batch), and tensor parallel with options.mesh = "model=2".
#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "meshtrain/meshtrain.h"
#include "meshtrain/models/seq2seq_generate.h"
#include "meshtrain/train/rouge.h"

using namespace mt;

constexpr int64_t kMaxLen = 6;  // 5 words and the end token; every batch is padded to it (equal shapes on all ranks)
const std::vector<std::string> kWords = {"apple", "bird", "cat", "dog",  "egg", "fish",
                                         "goat",  "hat",  "ink", "jam", "kite", "lamp"};

// n pairs {"source": "kite dog apple", "target": "apple dog kite"}, no source twice.
std::vector<data::Example> sorting_pairs(size_t n) {
  std::mt19937 rng(7);
  std::set<std::string> seen;
  std::vector<data::Example> pairs;
  auto join = [](const std::vector<std::string>& ws) {
    return std::accumulate(ws.begin() + 1, ws.end(), ws[0], [](std::string a, const std::string& w) { return a + " " + w; });
  };
  while (pairs.size() < n) {
    std::vector<std::string> ws = kWords;
    std::shuffle(ws.begin(), ws.end(), rng);
    ws.resize(3 + rng() % 3);
    const std::string source = join(ws);
    std::sort(ws.begin(), ws.end());
    if (seen.insert(source).second) pairs.push_back({{"source", source}, {"target", join(ws)}});
  }
  return pairs;
}

// collate: tokenize source and target, each truncated and closed by the end token, padded
// to kMaxLen; the labels are -100 on padding, and the decoder reads them shifted right
// behind its start token (teacher forcing).
train::Batch collate(const tokenizers::Tokenizer& tok, const models::Seq2SeqLm& lm, const std::vector<data::Example>& examples) {
  const int64_t n = int64_t(examples.size());
  std::vector<int64_t> ids(n * kMaxLen, lm.pad_token_id), mask(n * kMaxLen, 0), labels(n * kMaxLen, -100);
  for (int64_t i = 0; i < n; ++i) {
    auto tokens = [&](const std::string& field) {
      std::vector<int64_t> out;
      for (int32_t id : tok.encode(examples[i].str(field), /*add_special_tokens=*/false).ids) out.push_back(id);
      out.resize(std::min<size_t>(out.size(), kMaxLen - 1));
      out.push_back(lm.eos_token_id);
      return out;
    };
    const std::vector<int64_t> source = tokens("source"), target = tokens("target");
    std::copy(source.begin(), source.end(), ids.begin() + i * kMaxLen);
    std::fill_n(mask.begin() + i * kMaxLen, source.size(), 1);
    std::copy(target.begin(), target.end(), labels.begin() + i * kMaxLen);
  }
  auto array = [n](const std::vector<int64_t>& v) { return Array::from_vector(v, {n, kMaxLen}); };
  return {{"input_ids", array(ids)}, {"attention_mask", array(mask)}, {"labels", array(labels)},
          {"decoder_input_ids", models::shift_right(array(labels), lm.decoder_start_token_id, lm.pad_token_id)}};
}

// loss: the teacher-forced cross-entropy of the decoder's next-token logits; dropout only while training.
Array loss(const models::PretrainedModel& model, const Params& params, const train::Batch& batch, const RngKey& key,
           bool training) {
  models::Seq2SeqInputs in{batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"]};
  return model.seq2seq_loss(params, in, batch["labels"], key, training);
}

// predict: beam search (4 beams) from each source of the batch with the parameters given;
// every process generates the whole global batch. Output "tokens" (B, kMaxLen), padded.
train::Batch predict(const models::PretrainedModel& model, const Params& params, const train::Batch& batch) {
  const models::Seq2SeqLm lm = model.seq2seq_lm(params);
  const std::vector<int64_t> ids = dist::to_host(batch["input_ids"]).to_ints(),
                             mask = dist::to_host(batch["attention_mask"]).to_ints();
  std::vector<std::vector<int64_t>> sources(ids.size() / kMaxLen);
  for (size_t k = 0; k < ids.size(); ++k)
    if (mask[k]) sources[k / kMaxLen].push_back(ids[k]);
  models::GenerationConfig beams;
  beams.max_new_tokens = kMaxLen, beams.num_beams = 4, beams.pad_token_id = lm.pad_token_id;
  const models::GenerationResult r = models::generate_seq2seq(lm, sources, beams);
  std::vector<int64_t> out(ids.size(), lm.pad_token_id);
  for (size_t i = 0; i < r.tokens.size(); ++i) std::copy(r.tokens[i].begin(), r.tokens[i].end(), out.begin() + i * kMaxLen);
  return {{"tokens", Array::from_vector(out, {int64_t(sources.size()), kMaxLen})}};
}

int main(int argc, char** argv) {
  return dist::run_guarded([&] {
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 300;
    MT_CHECK(steps > 0, "steps must be positive, got ", steps);
    const std::string workdir = argc > 2 ? argv[2] : "runs/seq2seq";

    // The tokenizer: a WordPiece vocabulary of BERT's special tokens and the twelve words
    // (every process writes the same file, atomically). The last 64 pairs are held out.
    std::filesystem::create_directories(workdir);
    std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    for (const std::string& w : kWords) vocab += w + "\n";
    io::write_file_atomic(workdir + "/vocab.txt", vocab);
    auto tokenizer = tokenizers::load_tokenizer(workdir + "/vocab.txt");
    const std::vector<data::Example> pairs = sorting_pairs(2000 + 64), test_pairs(pairs.end() - 64, pairs.end());
    auto train_set = data::make_dataset({pairs.begin(), pairs.end() - 64}), test_set = data::make_dataset(test_pairs);

    train::DeployerOptions options;
    options.workdir = workdir;  // metrics.jsonl and TensorBoard events
    train::Deployer deployer(options);
    // A small BART (2 + 2 layers, width 128) from scratch: [PAD] pads, [SEP] ends a text and starts the decoder.
    const int64_t pad = *tokenizer->token_to_id("[PAD]"), eos = *tokenizer->token_to_id("[SEP]");
    models::PretrainedOptions init;
    init.init_key = deployer.init_key();
    const models::PretrainedModel model =
        models::init_model(models::model_spec("bart").small_seq2seq_config(tokenizer->vocab_size(), pad, eos), init);
    const models::Seq2SeqLm lm = model.seq2seq_lm();  // its pad, end and decoder start ids

    auto collate_fn = [&](const std::vector<data::Example>& ex) { return collate(*tokenizer, lm, ex); };
    auto loss_fn = [&](const Params& p, const train::Batch& b, const RngKey& key, bool training) {
      return loss(model, p, b, key, training);
    };
    auto lr = optim::warmup_cosine_decay_schedule(0.0, 2e-3, steps / 10, steps);
    auto optimizer = optim::chain({optim::clip_by_global_norm(1.0), optim::adamw(lr)});
    train::Trainer trainer(deployer, collate_fn, loss_fn, model.params, optimizer,
                           deployer.sharding_rules(model.params, model.param_roles()));
    // The Predictor runs predict and turns each row of tokens back into text.
    train::Predictor<std::string> predictor(
        deployer, collate_fn, [&](const Params& p, const train::Batch& b) { return predict(model, p, b); },
        [&](const train::Batch& host) {
          const std::vector<int64_t> t = host["tokens"].to_ints();
          std::vector<std::string> texts;
          for (size_t i = 0; i < t.size(); i += kMaxLen)
            texts.push_back(tokenizer->decode(std::vector<int32_t>(t.begin() + i, t.begin() + i + kMaxLen)));
          return texts;
        });

    train::FitOptions fit;
    fit.per_device_batch_size = 32 / deployer.data_size();
    fit.epochs = 1000;  // max_steps ends the run
    fit.max_steps = steps;
    fit.learning_rate = lr;
    fit.save_last = false;
    // Evaluated at each epoch's end and after the last step: the held-out loss, and the
    // ROUGE-L and exact match of the predicted texts.
    fit.eval_data = test_set;
    std::vector<std::string> predictions, targets;
    for (const data::Example& e : test_pairs) targets.push_back(e.str("target"));
    fit.eval_fn = [&](const Params& p) {
      predictions = predictor.predict(p, test_set, fit.per_device_batch_size);
      double exact = 0;
      for (size_t i = 0; i < targets.size(); ++i) exact += predictions[i] == targets[i];
      return std::map<std::string, double>{{"rougeL", train::mean_rouge(targets, predictions).rougeL.fmeasure},
                                           {"exact_match", exact / double(targets.size())}};
    };
    train::FitResult result = trainer.fit(train_set, fit);

    const std::vector<double>& losses = result.losses;
    const size_t k = std::max<size_t>(1, losses.size() / 10);
    const double first = std::accumulate(losses.begin(), losses.begin() + k, 0.0) / k,
                 last = std::accumulate(losses.end() - k, losses.end(), 0.0) / k,
                 exact = result.evals.back().at("exact_match");
    deployer.log("train loss " + std::to_string(first) + " -> " + std::to_string(last) + " (mean of the first and last " +
                 std::to_string(k) + " steps)");
    deployer.log("held out: ROUGE-L " + std::to_string(result.evals.back().at("rougeL")) + ", exact match " +
                 std::to_string(exact) + " on " + std::to_string(targets.size()) + " pairs (beam search, 4 beams)");
    for (size_t i = 0; i < 4; ++i) deployer.log("  " + test_pairs[i].str("source") + "  ->  " + predictions[i]);
    if (!(last < first)) deployer.log("error: the loss did not fall");
    if (exact < 0.8) deployer.log("error: exact match below 0.8");
    return last < first && exact >= 0.8 ? 0 : 1;
  });
}
