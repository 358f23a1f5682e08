// PEFT adapters cross the border both ways with Hugging Face `peft` itself (PyPI, in the
// project's .venv; tests/python/peft_twin.py): a LoRA adapter meshtrain writes loads into
// PeftModel.from_pretrained on the same base folder and gives meshtrain's logits, and an
// adapter peft writes (random A and B: init_lora_weights=False) loads into meshtrain and
// gives peft's logits; GPT-2 (Conv1D, fan_in_fan_out), LLaMA (all projections, rsLoRA) and a
// BERT classifier (SEQ_CLS, the new classifier and pooler as modules_to_save). Bases are
// random-weight models written by save_pretrained; adapters have B != 0, so they carry signal.
// Logits agree within 1e-5 (+ 1e-6 of the largest logit: peft's own random adapters, kaiming
// A and B at rsLoRA scale 8, make logits in the tens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <regex>

#include "meshtrain/io/safetensors.h"
#include "meshtrain/models/peft_adapter.h"
#include "meshtrain/models/pretrained.h"
#include "tests/support/model_twins.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

const Tolerance kLogitsTol{1e-5, 1e-5, 1e-6};

double max_abs(const Array& a) {
  double m = 0;
  for (float x : a.to_floats()) m = std::max(m, double(std::abs(x)));
  return m;
}

using namespace mt::models;
using nlohmann::json;

json gpt2_config() {
  return {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 61}, {"n_embd", 32},
          {"n_layer", 2}, {"n_head", 4}, {"n_positions", 32}, {"bos_token_id", 1}, {"eos_token_id", 1}};
}

json llama_config() {
  return {{"model_type", "llama"},   {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 61},
          {"hidden_size", 32},       {"intermediate_size", 48},              {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2},            {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-6},    {"tie_word_embeddings", false},         {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

// A masked-LM BERT: as a classifier its classifier and pooler are new heads.
json bert_config() {
  return {{"model_type", "bert"}, {"architectures", {"BertForMaskedLM"}}, {"vocab_size", 61},
          {"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"intermediate_size", 40},
          {"max_position_embeddings", 32}, {"type_vocab_size", 2}, {"pad_token_id", 0}};
}

Array batch_ids() { return random_ints({2, 9}, 17, 3, 61); }

class PeftInterop : public TempDir {
 protected:
  std::string base_dir() const { return (dir_ / "base").string(); }
  std::string adapter_dir() const { return (dir_ / "adapter").string(); }

  // A random-weight base written as a Hugging Face folder.
  void write_base(const json& config) {
    PretrainedModel m = init_model(config, {.load_tokenizer = false, .print_report = false});
    m.params = random_model_params(m.param_defs(), 5);
    save_pretrained(m, base_dir());
  }

  // Runs tests/python/peft_twin.py; returns its logits.
  Array peft(const std::string& mode, const std::string& extra) {
    const std::string in = (dir_ / "in.safetensors").string(), out = (dir_ / "out.safetensors").string();
    io::save_safetensors(in, Params{{"input_ids", batch_ids()}});
    const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/peft_twin.py " + mode +
                            " " + base_dir() + " " + adapter_dir() + " " + in + " " + out + " " + extra + " 2>&1";
    if (std::system(cmd.c_str()) != 0) throw Error("peft twin failed: " + cmd);
    return io::load_safetensors(out)["logits"];
  }

  static Array logits_of(const PretrainedModel& m) {
    if (m.model_type == "bert")
      return bert_apply(m.config.as<BertConfig>(), m.params, BertInputs{.input_ids = batch_ids()}).logits;
    return m.decoder_logits(m.params, {.input_ids = batch_ids()}, {}, false);
  }

  // meshtrain -> peft: adapters with random A and B (and random new heads) saved by
  // save_adapter; peft's logits on the same base equal meshtrain's.
  void meshtrain_to_peft(const std::string& label, const json& config, LoraOptions lora,
                         const std::vector<std::string>& modules_to_save = {}) {
    write_base(config);
    PretrainedOptions o{.print_report = false};
    if (!modules_to_save.empty()) {
      o.bert_head = BertHead::sequence_classification;
      o.num_labels = 3;
      o.new_params = NewParams::heads;
    }
    PretrainedModel m = from_pretrained(base_dir(), o);
    add_lora(m, lora, RngKey{4, 0});
    const std::regex adapters(lora_parameter_pattern());
    uint64_t seed = 100;
    size_t randomized = 0;
    for (auto& [path, value] : m.params) {
      const bool head = path.rfind("classifier.", 0) == 0 || path.rfind("bert.pooler.", 0) == 0;
      if (std::regex_match(path, adapters) || (head && !modules_to_save.empty())) {
        value = random_normal(value.shape(), seed++, DType::f32, 0.3);
        ++randomized;
      }
    }
    ASSERT_GT(randomized, 0u);
    save_adapter(m, adapter_dir(), base_dir(), modules_to_save);
    const Array ours = logits_of(m);
    const Array theirs = peft("logits", "");
    const double err = expect_close(ours, theirs, kLogitsTol, label);
    std::cout << "[peft] meshtrain adapter -> peft " << label << ": " << randomized
              << " random adapter/head tensors, max |logits err| " << err << " of max |logit| " << max_abs(theirs) << "\n";
  }

  // peft -> meshtrain: peft makes and saves the adapter; meshtrain loads base + adapter.
  void peft_to_meshtrain(const std::string& label, const json& config, const std::string& make_args) {
    write_base(config);
    const Array theirs = peft("make", make_args);
    PretrainedOptions o{.print_report = false};
    adapter_base_options(adapter_dir(), o);
    if (o.bert_head) o.new_params = NewParams::heads;  // the adapter brings the heads
    PretrainedModel m = from_pretrained(base_dir(), o);
    const std::vector<std::string> replaced = load_adapter(m, adapter_dir());
    const double err = expect_close(logits_of(m), theirs, kLogitsTol, label);
    std::cout << "[peft] peft adapter -> meshtrain " << label << ": " << replaced.size()
              << " saved modules replaced, max |logits err| " << err << " of max |logit| " << max_abs(theirs) << "\n";
  }
};

LoraOptions lora(int64_t rank, double alpha, const std::string& targets, bool rslora = false) {
  LoraOptions o;
  o.rank = rank, o.alpha = alpha, o.targets = targets, o.use_rslora = rslora;
  return o;
}

TEST_F(PeftInterop, Gpt2MeshtrainAdapterLoadsIntoPeft) {
  meshtrain_to_peft("GPT-2 c_attn/c_proj/c_fc r4", gpt2_config(), lora(4, 8.0, R"((c_attn|c_proj|c_fc)$)"));
}

TEST_F(PeftInterop, LlamaMeshtrainRsLoraAdapterLoadsIntoPeft) {
  meshtrain_to_peft("LLaMA all projections rsLoRA r4", llama_config(),
                    lora(4, 16.0, R"((q|k|v|o|gate|up|down)_proj$)", true));
}

TEST_F(PeftInterop, BertClassifierMeshtrainAdapterLoadsIntoPeft) {
  meshtrain_to_peft("BERT SEQ_CLS query/value r2", bert_config(), lora(2, 4.0, R"(attention\.self\.(query|value)$)"),
                    {"classifier", "pooler"});
}

TEST_F(PeftInterop, Gpt2PeftAdapterLoadsIntoMeshtrain) {
  peft_to_meshtrain("GPT-2 c_attn/c_proj r4", gpt2_config(), "CAUSAL_LM 4 8 c_attn,c_proj");
}

TEST_F(PeftInterop, LlamaPeftRsLoraAdapterLoadsIntoMeshtrain) {
  peft_to_meshtrain("LLaMA q/k/v/o/gate/up/down rsLoRA r4", llama_config(),
                    "CAUSAL_LM 4 2 q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj rslora");
}

TEST_F(PeftInterop, BertClassifierPeftAdapterLoadsIntoMeshtrain) {
  peft_to_meshtrain("BERT SEQ_CLS query/value r2", bert_config(), "SEQ_CLS 2 4 query,value save=classifier,pooler");
}

}  // namespace
}  // namespace mt::testing
