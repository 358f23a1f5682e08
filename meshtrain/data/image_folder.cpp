#include "meshtrain/data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "meshtrain/core/error.h"

namespace mt::data {

namespace fs = std::filesystem;

namespace {

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

}  // namespace

int64_t ImageFolder::label_of(const CaptionedImage& image) const {
  const std::string& name = image.captions.at(0);
  return int64_t(std::find(classes.begin(), classes.end(), name) - classes.begin());
}

ImageFolder read_image_folder(const std::string& dir, const std::vector<std::string>& classes) {
  MT_CHECK(fs::is_directory(dir), "[image_folder] ", dir, " is not a directory (expected one subfolder of images per class)");
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory()) found.push_back(entry.path().filename().string());
  std::sort(found.begin(), found.end());
  MT_CHECK(!found.empty(), "[image_folder] ", dir, " has no class subfolders (expected ", dir,
           "/<class>/<image>.png|.jpg)");
  ImageFolder out;
  out.classes = classes.empty() ? found : classes;
  for (const std::string& name : found) {
    MT_CHECK(std::find(out.classes.begin(), out.classes.end(), name) != out.classes.end(), "[image_folder] ", dir, "/",
             name, ": class '", name, "' is not one of the training classes (", detail::join(out.classes), ")");
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(fs::path(dir) / name))
      if (entry.is_regular_file() && is_image_file(entry.path())) files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    MT_CHECK(!files.empty() || !classes.empty(), "[image_folder] ", dir, "/", name,
             " holds no .png or .jpg images: every training class needs some");
    for (std::string& f : files) out.images.push_back({std::move(f), {name}});
  }
  MT_CHECK(!out.images.empty(), "[image_folder] ", dir, " holds no .png or .jpg images in its class subfolders");
  return out;
}

}  // namespace mt::data
