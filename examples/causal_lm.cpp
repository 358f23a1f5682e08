// Language modeling: miniGPT trained on Tiny Shakespeare, one token per byte, then asked
// to continue a prompt. The corpus is tokenized once and packed into fixed-length
// sequences (PackedDataset); the user's functions are collate (sequences -> inputs and
// next-token targets) and loss; generation runs the trained parameters with a KV cache.
//
//   example_causal_lm [data_dir=../shared/data] [steps=500] [workdir=runs/causal_lm]
//
// Runs unchanged under `mpirun -np 2` (data parallel), and tensor parallel with
// options.mesh = "model=2".
#include <cmath>
#include <numeric>

#include "meshtrain/meshtrain.h"

using namespace mt;

constexpr int64_t kSeqLen = 128;

// The tokenizer: byte values are the token ids, so any text has a vocabulary of 256.
std::vector<int64_t> bytes_of(const std::string& text) {
  std::vector<int64_t> ids;
  for (char c : text) ids.push_back(uint8_t(c));
  return ids;
}

// Each packed example holds kSeqLen + 1 tokens: the model reads the first kSeqLen and
// predicts each following one.
train::Batch collate(const std::vector<data::Example>& examples) {
  std::vector<int64_t> ids, labels;
  for (const data::Example& e : examples) {
    const std::vector<int64_t>& tokens = e.tokens("tokens");
    ids.insert(ids.end(), tokens.begin(), tokens.end() - 1);
    labels.insert(labels.end(), tokens.begin() + 1, tokens.end());
  }
  const int64_t n = int64_t(examples.size());
  return {{"ids", Array::from_vector(ids, {n, kSeqLen})}, {"labels", Array::from_vector(labels, {n, kSeqLen})}};
}

int main(int argc, char** argv) {
  return dist::run_guarded([&] {
    const std::string data_dir = argc > 1 ? argv[1] : "../shared/data";
    const int64_t steps = argc > 2 ? std::stoll(argv[2]) : 500;
    MT_CHECK(steps > 0, "steps must be positive, got ", steps);
    const std::string workdir = argc > 3 ? argv[3] : "runs/causal_lm";

    // The play's last 5% is held out to measure the loss on unseen text.
    const std::string text = data::read_text_file(data_dir + "/text/tinyshakespeare.txt");
    const size_t split = text.size() * 95 / 100;
    data::PackedDatasetOptions packing{.seq_len = kSeqLen};
    auto train_set = std::make_shared<data::PackedDataset>(std::vector{text.substr(0, split)}, bytes_of, packing);
    auto valid_set = std::make_shared<data::PackedDataset>(std::vector{text.substr(split)}, bytes_of, packing);

    models::MiniGptConfig config;  // the tutorial's model, narrower and shallower
    config.vocab_size = 256;
    config.maxlen = kSeqLen;
    config.embed_dim = 128;
    config.num_heads = 4;
    config.feed_forward_dim = 256;
    config.num_transformer_blocks = 2;
    config.dropout_rate = 0.0;  // 500 steps read the play about once: nothing to overfit yet

    train::DeployerOptions options;
    options.workdir = workdir;  // metrics.jsonl and TensorBoard events
    train::Deployer deployer(options);
    Params params = models::minigpt_init(config, deployer.init_key());
    auto loss_fn = [&](const Params& p, const train::Batch& batch, const RngKey& key, bool training) {
      Array logits = models::minigpt_apply(config, p, {.input_ids = batch["ids"]}, key, training);
      return cross_entropy(logits, batch["labels"]);
    };
    auto lr = optim::warmup_cosine_decay_schedule(0.0, 3e-3, steps / 10, steps);
    auto optimizer = optim::chain({optim::clip_by_global_norm(1.0), optim::adamw(lr)});
    train::Trainer trainer(deployer, collate, loss_fn, params, optimizer,
                           deployer.sharding_rules(params, models::minigpt_param_roles(config)));

    train::FitOptions fit;
    fit.per_device_batch_size = 16 / deployer.data_size();
    fit.max_steps = steps;
    fit.learning_rate = lr;             // shown with the loss
    fit.tokens_per_example = kSeqLen;   // for tokens/s
    fit.eval_data = valid_set;          // its loss is computed after the last step
    fit.save_last = false;
    train::FitResult result = trainer.fit(train_set, fit);
    const std::vector<double>& losses = result.losses;
    const double valid_loss = result.evals.back().at("eval_loss");

    // Generation: the trained parameters as a causal LM, sampled at temperature 0.8.
    const std::string prompt = "ROMEO:\n";
    models::GenerationConfig sampling;
    sampling.max_new_tokens = kSeqLen - int64_t(prompt.size());  // the model knows kSeqLen positions
    sampling.temperature = 0.8;
    // generate() reads logits on the host, so it gets whole (gathered) parameters; with one
    // process they already are.
    Params whole;
    for (const auto& [path, value] : trainer.params()) whole.set(path, dist::to_host(value));
    auto lm = models::minigpt_causal_lm(config, whole);
    std::vector<int64_t> generated = models::generate(lm, {bytes_of(prompt)}, sampling).tokens[0];

    const size_t k = std::max<size_t>(1, losses.size() / 10);
    const double first = std::accumulate(losses.begin(), losses.begin() + k, 0.0) / k,
                 last = std::accumulate(losses.end() - k, losses.end(), 0.0) / k;
    deployer.log("train loss " + std::to_string(first) + " -> " + std::to_string(last) + " (mean of the first and last " +
                 std::to_string(k) + " steps; uniform over bytes: " + std::to_string(std::log(256.0)) + ")");
    deployer.log("validation loss " + std::to_string(valid_loss) + ", perplexity " +
                 std::to_string(train::perplexity(valid_loss)));
    deployer.log("sample:\n" + prompt + std::string(generated.begin(), generated.end()));
    if (!(last < first)) deployer.log("error: the loss did not fall");
    return last < first ? 0 : 1;
  });
}
