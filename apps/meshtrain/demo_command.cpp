// `meshtrain demo`: the engine end to end on a fresh machine — a small byte-level
// transformer language model trained on Debian's fortunes corpus (or --data FILE),
// printing the loss as it falls and a sample of generated text.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "apps/meshtrain/commands.h"
#include "meshtrain/meshtrain.h"

namespace mt::cli {
namespace {

struct DemoOptions {
  std::string data = "/usr/share/games/fortunes";
  int steps = 600;
  int batch = 16;
  int context = 64;
  int embed = 128;
  int layers = 2;
  int heads = 4;
  double lr = 3e-3;
  uint64_t seed = 0;
  int sample_chars = 300;
};

// Fortune files hold quotes separated by lines containing only '%'; any other file is
// taken as plain text.
std::string load_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  MT_CHECK(fs::exists(path), "[demo] data path '", path, "' does not exist (install Debian's fortunes or pass --data)");
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && e.path().extension().empty()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line;
    while (std::getline(in, line)) text += line == "%" ? "\n" : line + "\n";
  }
  MT_CHECK(text.size() > 1000, "[demo] corpus at '", path, "' is too small (", text.size(), " bytes)");
  return text;
}

Params init_model(const DemoOptions& o, const RngKey& key) {
  const int64_t c = o.embed;
  Params p;
  int stream = 0;
  auto normal = [&](Shape s, double std) { return random_normal(key.fold_in(uint64_t(stream++)), s, DType::f32, 0.0, std); };
  p.set("wte", normal({256, c}, 0.02));
  p.set("wpe", normal({o.context, c}, 0.01));
  for (int l = 0; l < o.layers; ++l) {
    std::string b = "h." + std::to_string(l) + ".";
    p.set(b + "ln_1.weight", Array::ones({c}));
    p.set(b + "ln_1.bias", Array::zeros({c}));
    p.set(b + "attn.c_attn.weight", normal({c, 3 * c}, 0.02));
    p.set(b + "attn.c_attn.bias", Array::zeros({3 * c}));
    p.set(b + "attn.c_proj.weight", normal({c, c}, 0.02 / std::sqrt(2.0 * o.layers)));
    p.set(b + "attn.c_proj.bias", Array::zeros({c}));
    p.set(b + "ln_2.weight", Array::ones({c}));
    p.set(b + "ln_2.bias", Array::zeros({c}));
    p.set(b + "mlp.c_fc.weight", normal({c, 4 * c}, 0.02));
    p.set(b + "mlp.c_fc.bias", Array::zeros({4 * c}));
    p.set(b + "mlp.c_proj.weight", normal({4 * c, c}, 0.02 / std::sqrt(2.0 * o.layers)));
    p.set(b + "mlp.c_proj.bias", Array::zeros({c}));
  }
  p.set("ln_f.weight", Array::ones({c}));
  p.set("ln_f.bias", Array::zeros({c}));
  return p;
}

// GPT-2-style pre-LN decoder over bytes; logits tied to the byte embedding.
Array forward(const DemoOptions& o, const Params& p, const Array& ids) {
  const int64_t b = ids.dim(0), t = ids.dim(1), c = o.embed, h = o.heads;
  Array x = add(embedding(p["wte"], ids), slice(p["wpe"], 0, 0, t));
  for (int l = 0; l < o.layers; ++l) {
    std::string n = "h." + std::to_string(l) + ".";
    Array a = layer_norm(x, p[n + "ln_1.weight"], p[n + "ln_1.bias"]);
    Array qkv = add(matmul(a, p[n + "attn.c_attn.weight"]), p[n + "attn.c_attn.bias"]);
    auto heads = [&](int64_t i) { return swap_axes(reshape(slice(qkv, -1, i * c, (i + 1) * c), {b, t, h, c / h}), 1, 2); };
    Array y = scaled_dot_product_attention(heads(0), heads(1), heads(2), Array(), {.causal = true});
    y = reshape(swap_axes(y, 1, 2), {b, t, c});
    x = add(x, add(matmul(y, p[n + "attn.c_proj.weight"]), p[n + "attn.c_proj.bias"]));
    Array m = layer_norm(x, p[n + "ln_2.weight"], p[n + "ln_2.bias"]);
    m = gelu(add(matmul(m, p[n + "mlp.c_fc.weight"]), p[n + "mlp.c_fc.bias"]), true);
    x = add(x, add(matmul(m, p[n + "mlp.c_proj.weight"]), p[n + "mlp.c_proj.bias"]));
  }
  x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]);
  return matmul(x, p["wte"], false, true);  // (B, T, 256)
}

// Random windows of context+1 bytes: inputs and next-byte targets.
std::pair<Array, Array> sample_batch(const std::string& text, const DemoOptions& o, const RngKey& key) {
  std::vector<int64_t> x(size_t(o.batch * o.context)), y(x.size());
  const uint64_t span = text.size() - size_t(o.context) - 1;
  for (int i = 0; i < o.batch; ++i) {
    auto w = key.block(uint64_t(i));
    uint64_t start = (uint64_t(w[0]) << 32 | w[1]) % span;
    for (int j = 0; j < o.context; ++j) {
      x[size_t(i * o.context + j)] = uint8_t(text[start + size_t(j)]);
      y[size_t(i * o.context + j)] = uint8_t(text[start + size_t(j) + 1]);
    }
  }
  return {Array::from_vector(x, {o.batch, o.context}), Array::from_vector(y, {o.batch, o.context})};
}

// Adam with bias correction, enough for the demo; the optimizer library is meshtrain/optim.
struct Adam {
  double lr, b1 = 0.9, b2 = 0.99, eps = 1e-8;
  int step = 0;
  Params m, v;
  void update(Params& params, const Params& grads) {
    ++step;
    const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
    for (auto& [path, value] : params) {
      const Array& g = grads[path];
      if (!m.contains(path)) {
        m.set(path, zeros_like(g));
        v.set(path, zeros_like(g));
      }
      m.at(path) = add(mul(m[path], b1), mul(g, 1 - b1));
      v.at(path) = add(mul(v[path], b2), mul(square(g), 1 - b2));
      value = sub(value, mul(div(m[path], add(sqrt(div(v[path], c2)), eps)), lr / c1));
    }
  }
};

std::string generate(const DemoOptions& o, const Params& p, std::string prompt, const RngKey& key) {
  for (int i = 0; i < o.sample_chars; ++i) {
    std::string window = prompt.substr(prompt.size() > size_t(o.context) ? prompt.size() - size_t(o.context) : 0);
    std::vector<int64_t> ids(window.begin(), window.end());
    for (auto& id : ids) id = uint8_t(id);
    Array logits = forward(o, p, Array::from_vector(ids, {1, int64_t(ids.size())}));
    Array last = reshape(slice(logits, 1, -1, logits.dim(1)), {256});
    std::vector<float> probs = softmax(mul(last, 1.0 / 0.8)).to_floats();  // temperature 0.8
    float u = uniform_at(key, uint64_t(i)), acc = 0;
    int next = 255;
    for (int c = 0; c < 256; ++c) {
      acc += probs[size_t(c)];
      if (u < acc) {
        next = c;
        break;
      }
    }
    prompt.push_back(char(next));
  }
  return prompt;
}

void run_demo(const DemoOptions& o) {
  std::string text = load_corpus(o.data);
  RngKey key{o.seed, 0};
  Params params = init_model(o, key.fold_in(1));
  std::cout << "meshtrain demo: byte-level transformer (" << o.layers << " layers, width " << o.embed << ", "
            << params.total_elements() << " parameters) on " << o.data << " (" << text.size() / 1024 << " KiB)\n";
  auto loss_fn = [&](const Params& p, const Array& x, const Array& y) {
    return cross_entropy(forward(o, p, x), y);
  };
  Adam adam{o.lr};
  auto start = std::chrono::steady_clock::now();
  double first = 0, smoothed = 0;
  for (int step = 1; step <= o.steps; ++step) {
    auto [x, y] = sample_batch(text, o, key.fold_in(1000 + uint64_t(step)));
    auto [loss, grads] = value_and_grad(loss_fn)(params, x, y);
    adam.lr = o.lr * std::min(1.0, step / 20.0);  // short warm-up
    adam.update(params, grads);
    double l = loss.item();
    if (step == 1) first = smoothed = l;
    smoothed = 0.9 * smoothed + 0.1 * l;
    if (step % 20 == 0 || step == o.steps) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::cout << "step " << std::setw(4) << step << "/" << o.steps << "  loss " << std::fixed << std::setprecision(3)
                << smoothed << "  " << std::setprecision(0) << step * o.batch * o.context / secs << " tok/s\n"
                << std::flush;
    }
  }
  std::cout << "loss " << std::setprecision(3) << first << " -> " << smoothed << " (uniform over bytes: "
            << std::log(256.0) << ")\n\nsample:\n"
            << generate(o, params, "The ", key.fold_in(7)) << "\n";
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opts = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "train a small byte-level transformer and print a sample");
  cmd->add_option("--data", opts->data, "text file, or a directory of fortune files")->capture_default_str();
  cmd->add_option("--steps", opts->steps, "training steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--batch", opts->batch, "sequences per step")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--seed", opts->seed, "random seed")->capture_default_str();
  cmd->add_option("--lr", opts->lr, "peak learning rate")->capture_default_str();
  cmd->callback([opts] { run_demo(*opts); });
}

}  // namespace mt::cli
