// `meshtrain image-classify` end to end on images the test renders (tests/python/
// render_shape_classes.py: one shape of a random colour, size and position per 32x32 image, in
// one folder per class): a small ViT trained from scratch classifies 150 held-out images with
// at least 0.9 accuracy; eval_results.json's accuracy is predictions.jsonl's; transformers loads
// the model folder (ViTForImageClassification, its ViTImageProcessor and id2label) and
// classifies as meshtrain did; `eval` and `generate --image` score and classify as training
// did; training continues from that folder. Bad input: an evaluation
// class the training split lacks, an unreadable image (stopped before training with nothing
// written, or skipped and counted).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/support/cli_run.h"
#include "tests/support/temp_dir.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class ImageClassifyE2E : public TempDir {
 protected:
  void SetUp() override {
    TempDir::SetUp();
    data_ = dir_ / "shapes";
    ASSERT_EQ(std::system((std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/render_shape_classes.py " +
                           data_.string() + " 500 50 1").c_str()), 0);
  }
  std::string command(const fs::path& out, const std::string& eval_dir, const std::string& extra) const {
    return "image-classify --train-dir " + (data_ / "train").string() + " --eval-dir " + eval_dir +
           " --per-device-batch-size 32 --learning-rate 1e-3 --output-dir " + out.string() + " " + extra;
  }
  fs::path data_;
};

TEST_F(ImageClassifyE2E, ClassifiesHeldOutShapesAndTransformersAgrees) {
  const fs::path out = dir_ / "run";
  // 25 epochs: after 15 the default seed's run still confused triangles with squares on an
  // AVX2-only EPYC (0.77; another seed 0.92) with its loss at 0.48; after 25 it is at 0.001.
  const CliRun r = run_cli(command(out, (data_ / "eval").string(), "--config small-vit --epochs 25"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 classes (circle, square, triangle)"), std::string::npos) << r.out;
  const json results = json::parse(std::ifstream(out / "eval_results.json"));
  std::cout << "rendered shapes, 150 held-out images: " << results.dump() << "\n";
  EXPECT_GE(results.at("accuracy").get<double>(), 0.9);
  EXPECT_EQ(results.at("best").at("metric"), "accuracy");
  std::vector<std::string> images, predictions;
  int right = 0;
  std::ifstream in(out / "predictions.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    images.push_back(j.at("image")), predictions.push_back(j.at("prediction"));
    right += j.at("label") == j.at("prediction");
    EXPECT_NE(j.at("image").get<std::string>().find("/" + j.at("label").get<std::string>() + "/"), std::string::npos);
  }
  ASSERT_EQ(images.size(), 150u);
  EXPECT_NEAR(right / 150.0, results.at("accuracy").get<double>(), 1e-12);

  // transformers reads the folder and classifies the first 30 held-out images alike.
  std::string cmd = std::string(MT_VENV_PYTHON) + " " + MT_SOURCE_DIR + "/tests/python/classify_folder.py " +
                    (out / "model").string();
  for (size_t i = 0; i < images.size(); i += 5) cmd += " " + images[i];
  const CliRun hf = run_command(cmd, "classify_folder.py");
  ASSERT_EQ(hf.code, 0) << hf.out;
  const auto theirs = json::parse(hf.std_out).get<std::vector<std::string>>();
  ASSERT_EQ(theirs.size(), 30u);
  for (size_t i = 0; i < theirs.size(); ++i) EXPECT_EQ(theirs[i], predictions[i * 5]) << images[i * 5];

  // eval scores the run (its last checkpoint, preprocessed as its meta.json records) and the
  // exported folder as training's last evaluation did; generate --image names the class.
  for (const std::string model : {out.string(), (out / "model").string()}) {
    const CliRun e = run_cli("eval --model " + model + " --image-dir " + (data_ / "eval").string() + " --output " +
                             (dir_ / "eval.json").string());
    ASSERT_EQ(e.code, 0) << e.out;
    const json scored = json::parse(std::ifstream(dir_ / "eval.json"));
    EXPECT_NEAR(scored.at("eval_accuracy").get<double>(), results.at("accuracy").get<double>(), 1e-12) << model;
  }
  const CliRun g = run_cli("generate --model " + (out / "model").string() + " --image " + images[0] + " --image " + images[77]);
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.std_out, predictions[0] + "\n" + predictions[77] + "\n") << g.out;

  // Training goes on from the exported folder (its classes, weights and image processor).
  const CliRun more = run_cli(command(dir_ / "more", (data_ / "eval").string(), "--model " + (out / "model").string() +
                                                                                      " --epochs 1"));
  ASSERT_EQ(more.code, 0) << more.out;
  const json again = json::parse(std::ifstream(dir_ / "more" / "eval_results.json"));
  EXPECT_GE(again.at("accuracy").get<double>(), 0.85) << again.dump();
}

TEST_F(ImageClassifyE2E, BadFoldersAndImagesAreClearErrors) {
  // An evaluation class the training split lacks.
  fs::create_directories(dir_ / "odd" / "hexagon");
  fs::copy_file(data_ / "eval" / "circle" / "00000.png", dir_ / "odd" / "hexagon" / "a.png");
  CliRun r = run_cli(command(dir_ / "out1", (dir_ / "odd").string(), "--config small-vit --steps 2"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("class 'hexagon' is not one of the training classes (circle, square, triangle)"),
            std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "out1" / "checkpoints"));
  // A truncated image: stopped before training, naming it; or skipped and counted.
  fs::copy(data_ / "eval", dir_ / "cut", fs::copy_options::recursive);
  const fs::path bad = dir_ / "cut" / "square" / "00003.png";
  fs::resize_file(bad, fs::file_size(bad) / 2);
  r = run_cli(command(dir_ / "out2", (dir_ / "cut").string(), "--config small-vit --steps 2"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(bad.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nothing was trained"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "out2" / "checkpoints"));
  r = run_cli(command(dir_ / "out3", (dir_ / "cut").string(), "--config small-vit --steps 2 --skip-bad-images"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("skipped 1 unreadable images"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace mt::testing
