// Caption data (issue 47): JSON lines and COCO's captions file read into images with their
// references (rows of one image merged, several references kept in order); missing fields,
// wrong types, unknown image ids and images the directory lacks are errors naming the file and
// line or entry; unreadable images stop the run before training, naming the file, or are
// skipped and counted. The images are python3-sklearn's two JPEG photographs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/core/error.h"
#include "meshtrain/data/caption_rows.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;

class CaptionRows : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_caption_rows_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "img");
    const fs::path photos = "/usr/lib/python3/dist-packages/sklearn/datasets/images";
    fs::copy_file(photos / "china.jpg", dir_ / "img" / "a.jpg");
    fs::copy_file(photos / "flower.jpg", dir_ / "img" / "b.jpg");
    std::ifstream in(photos / "china.jpg", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir_ / "img" / "cut.jpg", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  std::string error_of(const std::string& path) {
    try {
      data::read_captions(path, (dir_ / "img").string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(CaptionRows, JsonLinesMergeRowsOfOneImage) {
  const std::string path = write("c.jsonl",
                                 "{\"image\": \"a.jpg\", \"caption\": \"a pagoda\"}\n\n"
                                 "{\"image\": \"b.jpg\", \"captions\": [\"a flower\", \"petals\"]}\n"
                                 "{\"image\": \"a.jpg\", \"caption\": \"a temple in trees\"}\n");
  const auto rows = data::read_captions(path, (dir_ / "img").string());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].image, (dir_ / "img" / "a.jpg").string());
  EXPECT_EQ(rows[0].captions, (std::vector<std::string>{"a pagoda", "a temple in trees"}));
  EXPECT_EQ(rows[1].captions, (std::vector<std::string>{"a flower", "petals"}));
}

TEST_F(CaptionRows, CocoCaptionsKeepSeveralReferencesPerImage) {
  const std::string path = write("coco.json", R"({"info": {}, "images": [{"id": 7, "file_name": "b.jpg"},
      {"id": 3, "file_name": "a.jpg"}], "annotations": [{"id": 1, "image_id": 3, "caption": "a pagoda"},
      {"id": 2, "image_id": 7, "caption": "a flower"}, {"id": 5, "image_id": 3, "caption": "green hills"}]})");
  const auto rows = data::read_captions(path, (dir_ / "img").string());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].image, (dir_ / "img" / "a.jpg").string());
  EXPECT_EQ(rows[0].captions, (std::vector<std::string>{"a pagoda", "green hills"}));
  EXPECT_EQ(rows[1].captions, (std::vector<std::string>{"a flower"}));
}

TEST_F(CaptionRows, BadRowsAreErrorsNamingFileAndLine) {
  const std::string no_caption = write("n.jsonl", "{\"image\": \"a.jpg\", \"caption\": \"x\"}\n{\"image\": \"b.jpg\"}\n");
  EXPECT_NE(error_of(no_caption).find(no_caption + ":2: no 'caption' field"), std::string::npos) << error_of(no_caption);
  const std::string typed = write("t.jsonl", "{\"image\": 4, \"caption\": \"x\"}\n");
  EXPECT_NE(error_of(typed).find(typed + ":1: 'image' must be a string"), std::string::npos) << error_of(typed);
  const std::string broken = write("b.jsonl", "{\"image\": \"a.jpg\", \"caption\": \"x\"}\n{oops\n");
  EXPECT_NE(error_of(broken).find(broken + ":2: not JSON"), std::string::npos) << error_of(broken);
  const std::string missing = write("m.jsonl", "{\"image\": \"a.jpg\", \"caption\": \"x\"}\n"
                                               "{\"image\": \"gone.png\", \"caption\": \"y\"}\n"
                                               "{\"image\": \"lost.png\", \"caption\": \"z\"}\n");
  const std::string m = error_of(missing);
  EXPECT_NE(m.find("lists 2 of 3 images that " + (dir_ / "img").string() + " does not hold"), std::string::npos) << m;
  EXPECT_NE(m.find((dir_ / "img" / "gone.png").string()), std::string::npos) << m;
  const std::string coco = write("bad_coco.json", R"({"images": [{"id": 1, "file_name": "a.jpg"}],
      "annotations": [{"image_id": 2, "caption": "x"}]})");
  EXPECT_NE(error_of(coco).find(coco + ": annotations[0]: image_id 2 is not in 'images'"), std::string::npos)
      << error_of(coco);
  try {
    data::read_captions(no_caption, (dir_ / "nowhere").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the image directory " + (dir_ / "nowhere").string() + " does not exist"),
              std::string::npos);
  }
}

TEST_F(CaptionRows, UnreadableImagesStopOrAreSkippedAndCounted) {
  const std::string path = write("c.jsonl",
                                 "{\"image\": \"a.jpg\", \"caption\": \"a pagoda\"}\n"
                                 "{\"image\": \"cut.jpg\", \"caption\": \"half a pagoda\"}\n"
                                 "{\"image\": \"b.jpg\", \"caption\": \"a flower\"}\n");
  const auto rows = data::read_captions(path, (dir_ / "img").string());
  try {
    data::check_images(rows, data::BadImages::stop);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((dir_ / "img" / "cut.jpg").string()), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was trained"), std::string::npos) << m;
  }
  size_t skipped = 0;
  const auto kept = data::check_images(rows, data::BadImages::skip, &skipped);
  EXPECT_EQ(skipped, 1u);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[1].captions, (std::vector<std::string>{"a flower"}));
}

}  // namespace
}  // namespace mt::testing
