// Images against PIL and transformers (tests/python/vit_image_oracle.py): real JPEG photographs
// (Debian's python3-sklearn ships two) and crops of them saved by PIL as PNG and JPEG in many
// modes decode to exactly the RGB bytes of Image.open(f).convert("RGB"), and ViTImageProcessor's
// pixel_values (each PIL filter, down- and upscaling, ImageNet statistics, no normalization)
// equal ours; their max error is printed. Bad files (truncated PNG and JPEG, not an image, a
// CMYK JPEG, a missing file) are errors naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "meshtrain/core/error.h"
#include "meshtrain/data/image_decode.h"
#include "meshtrain/data/image_processor.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/safetensors.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using data::Image;

struct Oracle {
  fs::path dir;
  Params expected;
  nlohmann::json configs;
};

const Oracle& oracle() {
  static const Oracle o = [] {
    Oracle r;
    r.dir = fs::temp_directory_path() / ("mt_image_oracle_" + std::to_string(getpid()));
    fs::remove_all(r.dir);
    const std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/vit_image_oracle.py " +
                            r.dir.string() + " 2>&1";
    if (std::system(cmd.c_str()) != 0) throw Error("the image oracle failed: " + cmd);
    r.expected = io::load_safetensors((r.dir / "expected.safetensors").string());
    r.configs = io::read_json_file((r.dir / "configs.json").string());
    return r;
  }();
  return o;
}

std::vector<std::string> image_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(oracle().dir / "images")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ImageDecode, EveryModeDecodesToPilsRgbBytes) {
  const std::vector<std::string> names = image_names();
  ASSERT_GE(names.size(), 14u);
  for (const std::string& name : names) {
    const Image im = data::read_image((oracle().dir / "images" / name).string());
    const Array& want = oracle().expected["decoded/" + name];
    ASSERT_EQ(want.shape(), (Shape{im.height, im.width, 3})) << name;
    const std::vector<int64_t> w = want.to_ints();
    int64_t worst = 0, differing = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const int64_t d = std::abs(w[i] - int64_t(im.rgb[i]));
      worst = std::max(worst, d);
      differing += d != 0;
    }
    std::printf("decode %-18s %4lldx%-4lld max |diff| %lld (%lld of %zu values differ)\n", name.c_str(),
                (long long)im.width, (long long)im.height, (long long)worst, (long long)differing, w.size());
    EXPECT_EQ(worst, 0) << name;
  }
}

TEST(ImageProcessor, PixelValuesEqualViTImageProcessorForEveryFilter) {
  for (const auto& [cname, cjson] : oracle().configs.items()) {
    const data::ImageProcessorConfig config = data::ImageProcessorConfig::from_json(cjson, cname);
    double worst_all = 0;
    for (const std::string& name : image_names()) {
      const Image im = data::read_image((oracle().dir / "images" / name).string());
      const Array got = data::pixel_values({im}, config);
      const Array& want = oracle().expected["pixels/" + cname + "/" + name];
      ASSERT_EQ(got.shape(), (Shape{1, want.dim(0), want.dim(1), want.dim(2)})) << cname << " " << name;
      const std::vector<float> g = got.to_floats(), w = want.to_floats();
      double worst = 0;
      for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, double(std::fabs(g[i] - w[i])));
      worst_all = std::max(worst_all, worst);
      EXPECT_LE(worst, 1e-6) << cname << " " << name;
    }
    std::printf("processor %-17s (%s, %lldx%lld) max |diff| over %zu images %.3g\n", cname.c_str(),
                data::resample_name(config.resample), (long long)config.width, (long long)config.height,
                image_names().size(), worst_all);
  }
}

TEST(ImageProcessor, ConfigFromAModelFolderAndItsErrors) {
  const fs::path dir = oracle().dir / "model";
  fs::create_directories(dir);
  std::ofstream(dir / "preprocessor_config.json")
      << R"({"feature_extractor_type": "ViTFeatureExtractor", "size": 30, "resample": 3, "image_mean": 0.5})";
  const data::ImageProcessorConfig c = data::load_image_processor_config(dir.string());
  EXPECT_EQ(c.height, 30);
  EXPECT_EQ(c.width, 30);
  EXPECT_EQ(c.resample, data::Resample::bicubic);
  EXPECT_EQ(c.image_mean[2], 0.5f);
  const std::string missing = error_of([&] { data::load_image_processor_config((dir / "none").string()); });
  EXPECT_NE(missing.find("no preprocessor_config.json"), std::string::npos) << missing;
  const std::string shortest =
      error_of([&] { data::ImageProcessorConfig::from_json({{"size", {{"shortest_edge", 224}}}}, "cfg.json"); });
  EXPECT_NE(shortest.find("cfg.json: 'size' must be"), std::string::npos) << shortest;
  const std::string resample = error_of([&] { data::ImageProcessorConfig::from_json({{"resample", 9}}, "cfg.json"); });
  EXPECT_NE(resample.find("resample 9"), std::string::npos) << resample;
  const std::string mean =
      error_of([&] { data::ImageProcessorConfig::from_json({{"image_mean", {0.1, 0.2}}}, "cfg.json"); });
  EXPECT_NE(mean.find("'image_mean' must be"), std::string::npos) << mean;
}

TEST(ImageDecode, BadFilesAreErrorsNamingThem) {
  const fs::path dir = oracle().dir / "broken";
  fs::create_directories(dir);
  for (const char* name : {"rgb.png", "china.jpg", "progressive.jpg"}) {
    const std::string bytes = read_bytes(oracle().dir / "images" / name);
    const fs::path cut = dir / (std::string("cut_") + name);
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    const std::string e = error_of([&] { data::read_image(cut.string()); });
    EXPECT_NE(e.find(cut.string()), std::string::npos) << e;
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("not a readable") != std::string::npos) << e;
  }
  const fs::path text = dir / "notes.png";
  std::ofstream(text) << "not an image at all";
  const std::string not_image = error_of([&] { data::read_image(text.string()); });
  EXPECT_NE(not_image.find(text.string() + ": not a PNG or JPEG file"), std::string::npos) << not_image;
  const std::string cmyk = error_of([&] { data::read_image((oracle().dir / "bad" / "cmyk.jpg").string()); });
  EXPECT_NE(cmyk.find("CMYK"), std::string::npos) << cmyk;
  const std::string missing = error_of([&] { data::read_image((dir / "absent.jpg").string()); });
  EXPECT_NE(missing.find("cannot open " + (dir / "absent.jpg").string()), std::string::npos) << missing;
}

}  // namespace
}  // namespace mt::testing
