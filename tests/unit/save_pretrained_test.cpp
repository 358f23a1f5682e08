// save_pretrained writes a model one tensor at a time (save_pretrained_streamed, the export of
// sharded runs): its files equal the whole-model conversion (to_hf_layout over every
// parameter at once, file shapes, the saved dtype, then one save_safetensors), each parameter
// is fetched once in the file's order and released before the next is fetched, a process that
// does not write fetches all the same and writes nothing, and a LoRA model is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "meshtrain/meshtrain.h"
#include "meshtrain/models/peft_adapter.h"
#include "tests/support/op_check.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

const std::string kData = MT_DATA_DIR;

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// What save_pretrained wrote before it streamed: the whole model converted at once.
void save_whole(const models::PretrainedModel& model, const fs::path& dir, DType dtype) {
  fs::create_directories(dir);
  Params params = model.params;
  if (model.spec().to_hf_layout) params = model.spec().to_hf_layout(model.config, std::move(params)).second;
  for (const models::ParamDef& d : model.spec().param_defs(model.config))
    if (d.file_shape && params.contains(d.path)) params.set(d.path, reshape(params[d.path], d.file_shape->dims()));
  for (auto& [path, v] : params)
    if (is_floating(v.dtype()) && v.dtype() != dtype) v = cast(v, dtype);
  io::save_safetensors((dir / "model.safetensors").string(), params, {{"format", "pt"}});
}

class SavePretrained : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_save_pretrained_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(SavePretrained, StreamedEqualsTheWholeModelConversion) {
  // GPT-2 keeps c_attn in another shape than its file; stories260K's q/k rows are interleaved
  // (llama2.c) and go back to Hugging Face's layout.
  const std::vector<std::pair<std::string, models::PretrainedModel>> cases{
      {"gpt2", models::from_pretrained(kData + "/models/hf-tiny-gpt2")},
      {"llama2c", models::load_llama2c_model(kData + "/models/stories260K/stories260K.bin")}};
  for (const auto& [name, model] : cases)
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(name + " " + dtype_name(dtype));
      const fs::path whole = dir_ / (name + "_whole_" + dtype_name(dtype)),
                     streamed = dir_ / (name + "_streamed_" + dtype_name(dtype)),
                     silent = dir_ / (name + "_silent_" + dtype_name(dtype));
      save_whole(model, whole, dtype);
      std::vector<std::string> fetched;
      std::weak_ptr<void> previous;
      int overlaps = 0;
      auto fetch = [&](const std::string& path) {
        if (!previous.expired()) ++overlaps;  // the last tensor fetched is still held
        Array copy = model.params.at(path).clone();
        previous = copy.impl()->storage;
        fetched.push_back(path);
        return copy;
      };
      models::save_pretrained_streamed(model, model.params, fetch, streamed.string(), dtype, true);
      const std::string expected = file_bytes(whole / "model.safetensors");
      ASSERT_FALSE(expected.empty());
      EXPECT_TRUE(file_bytes(streamed / "model.safetensors") == expected) << "the streamed file differs";
      EXPECT_EQ(overlaps, 0);
      EXPECT_EQ(fetched.size(), model.params.size());
      std::vector<std::string> order = fetched, paths = model.params.paths();
      std::sort(order.begin(), order.end());
      std::sort(paths.begin(), paths.end());
      EXPECT_EQ(order, paths);  // each once
      const nlohmann::json config = io::read_json_file((streamed / "config.json").string());
      EXPECT_EQ(config.at("torch_dtype"), dtype == DType::bf16 ? "bfloat16" : "float32");
      if (name == "llama2c") {  // its rows were permuted on the way out
        EXPECT_TRUE(model.config.as<models::LlamaConfig>().rope_interleaved);
        EXPECT_FALSE(config.value("rotary_interleaved", false));
      }
      // save_pretrained writes the same.
      models::save_pretrained(model, (dir_ / "plain").string(), dtype);
      EXPECT_TRUE(file_bytes(dir_ / "plain" / "model.safetensors") == expected);
      // A process that does not write fetches every tensor (the gathers are collective) and
      // leaves no file.
      const size_t before = fetched.size();
      models::save_pretrained_streamed(model, model.params, fetch, silent.string(), dtype, false);
      EXPECT_EQ(fetched.size() - before, model.params.size());
      EXPECT_FALSE(fs::exists(silent));
      std::cout << "  " << name << " " << dtype_name(dtype) << ": " << expected.size() << " identical bytes, "
                << model.params.size() << " tensors fetched one at a time\n";
    }
}

TEST_F(SavePretrained, StreamedRefusesLoraAndIntegerDtypes) {
  models::PretrainedModel model = models::from_pretrained(kData + "/models/hf-tiny-gpt2");
  auto fetch = [&](const std::string& path) { return model.params.at(path); };
  expect_error([&] { models::save_pretrained_streamed(model, model.params, fetch, (dir_ / "i").string(), DType::i32, true); },
               {"[save_pretrained]", "floating", "i32"});
  models::PretrainedModel adapted = model;
  models::LoraOptions lora;
  lora.rank = 2;
  models::add_lora(adapted, lora, RngKey{7, 0});
  expect_error([&] { models::save_pretrained_streamed(adapted, adapted.params, fetch, (dir_ / "l").string(), DType::f32, true); },
               {"[save_pretrained]", "LoRA", "merged"});
  EXPECT_FALSE(fs::exists(dir_ / "i"));
  EXPECT_FALSE(fs::exists(dir_ / "l"));
}

}  // namespace
}  // namespace mt
