#include "meshtrain/data/caption_rows.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/data/image_decode.h"

namespace mt::data {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Collects captions per image name, keeping first-mention order.
class Collector {
 public:
  void add(const std::string& name, std::string caption) {
    auto [it, fresh] = index_.emplace(name, rows_.size());
    if (fresh) rows_.push_back({name, {}});
    rows_[it->second].captions.push_back(std::move(caption));
  }
  std::vector<CaptionedImage> finish(const std::string& path, const std::string& image_dir) {
    MT_CHECK(!rows_.empty(), "[captions] ", path, " holds no captions");
    std::vector<std::string> missing;
    for (CaptionedImage& row : rows_) {
      row.image = (fs::path(image_dir) / row.image).string();
      if (!fs::is_regular_file(row.image)) missing.push_back(row.image);
    }
    if (!missing.empty()) {
      std::ostringstream names;
      for (size_t i = 0; i < missing.size() && i < 3; ++i) names << (i ? ", " : "") << missing[i];
      throw Error(detail::concat("[captions] ", path, " lists ", missing.size(), " of ", rows_.size(),
                                 " images that ", image_dir, " does not hold: ", names.str(),
                                 missing.size() > 3 ? ", ..." : ""));
    }
    return std::move(rows_);
  }

 private:
  std::vector<CaptionedImage> rows_;
  std::map<std::string, size_t> index_;
};

std::string text_field(const json& j, const char* key, const std::string& where) {
  MT_CHECK(j.contains(key), "[captions] ", where, ": no '", key, "' field");
  MT_CHECK(j[key].is_string(), "[captions] ", where, ": '", key, "' must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}

std::vector<CaptionedImage> read_coco(const json& j, const std::string& path, const std::string& image_dir) {
  MT_CHECK(j["images"].is_array() && j["annotations"].is_array(), "[captions] ", path,
           ": COCO's 'images' and 'annotations' must be arrays");
  std::map<int64_t, std::string> files;
  for (size_t i = 0; i < j["images"].size(); ++i) {
    const json& im = j["images"][i];
    const std::string where = path + ": images[" + std::to_string(i) + "]";
    MT_CHECK(im.is_object() && im.contains("id") && im["id"].is_number_integer(), "[captions] ", where,
             ": no integer 'id'");
    files[im["id"].get<int64_t>()] = text_field(im, "file_name", where);
  }
  Collector c;
  for (size_t i = 0; i < j["annotations"].size(); ++i) {
    const json& a = j["annotations"][i];
    const std::string where = path + ": annotations[" + std::to_string(i) + "]";
    MT_CHECK(a.is_object() && a.contains("image_id") && a["image_id"].is_number_integer(), "[captions] ", where,
             ": no integer 'image_id'");
    auto it = files.find(a["image_id"].get<int64_t>());
    MT_CHECK(it != files.end(), "[captions] ", where, ": image_id ", a["image_id"].get<int64_t>(),
             " is not in 'images'");
    c.add(it->second, text_field(a, "caption", where));
  }
  return c.finish(path, image_dir);
}

std::vector<CaptionedImage> read_lines(const std::string& text, const std::string& path, const std::string& image_dir) {
  Collector c;
  std::istringstream in(text);
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line_no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw Error(detail::concat("[captions] ", where, ": not JSON: ", e.what()));
    }
    MT_CHECK(j.is_object(), "[captions] ", where, ": each line must be a JSON object");
    const std::string image = text_field(j, "image", where);
    if (j.contains("captions")) {
      MT_CHECK(j["captions"].is_array() && !j["captions"].empty(), "[captions] ", where,
               ": 'captions' must be a non-empty list of strings");
      for (const json& cap : j["captions"]) {
        MT_CHECK(cap.is_string(), "[captions] ", where, ": 'captions' must hold strings, got ", cap.dump());
        c.add(image, cap.get<std::string>());
      }
    } else {
      c.add(image, text_field(j, "caption", where));
    }
  }
  return c.finish(path, image_dir);
}

}  // namespace

std::vector<CaptionedImage> read_captions(const std::string& path, const std::string& image_dir) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "[captions] cannot open ", path);
  MT_CHECK(fs::is_directory(image_dir), "[captions] the image directory ", image_dir, " does not exist");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // One object with images and annotations is COCO's layout; anything else is read as lines.
  json whole = json::parse(text, nullptr, false);
  if (!whole.is_discarded() && whole.is_object() && whole.contains("images") && whole.contains("annotations"))
    return read_coco(whole, path, image_dir);
  return read_lines(text, path, image_dir);
}

std::vector<CaptionedImage> check_images(std::vector<CaptionedImage> images, BadImages policy, size_t* skipped) {
  std::vector<std::string> errors(images.size());
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t i = 0; i < int64_t(images.size()); ++i) {
    try {
      read_image(images[size_t(i)].image);
    } catch (const std::exception& e) {
      errors[size_t(i)] = e.what();
    }
  }
  std::vector<CaptionedImage> kept;
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < images.size(); ++i) {
    if (errors[i].empty()) {
      kept.push_back(std::move(images[i]));
    } else {
      if (bad++ == 0) first = errors[i];
    }
  }
  if (bad > 0 && policy == BadImages::stop)
    throw Error(detail::concat(first, bad > 1 ? detail::concat(" (and ", bad - 1, " more unreadable images)") : "",
                               "; nothing was trained: fix or remove them, or skip them (--skip-bad-images)"));
  if (skipped) *skipped = bad;
  MT_CHECK(!kept.empty(), "[captions] every one of the ", images.size(), " images is unreadable");
  return kept;
}

}  // namespace mt::data
