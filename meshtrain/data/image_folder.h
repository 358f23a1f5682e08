#pragma once
// Images sorted into one folder per class (torchvision's ImageFolder layout):
//   DIR/<class name>/<image>.png|.jpg|.jpeg
// Classes are the subfolders' names in sorted order, numbered from 0, so the labels do not
// depend on the filesystem's listing order; images within a class are sorted by name. An
// evaluation split is read against the training split's classes: a class folder the training
// split lacks is an error naming it (a class without images there is allowed).
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/caption_rows.h"

namespace mt::data {

struct ImageFolder {
  std::vector<std::string> classes;
  // Each image's path and its class name as its one "caption", so check_images (caption_rows.h)
  // finds the unreadable ones before training.
  std::vector<CaptionedImage> images;
  // The class index of one of `images` (or of one check_images kept).
  int64_t label_of(const CaptionedImage& image) const;
};

// `classes` empty: the folder's own classes; otherwise the folder's subfolders must be among
// them (the training split's), and the labels are their indices there.
ImageFolder read_image_folder(const std::string& dir, const std::vector<std::string>& classes = {});

}  // namespace mt::data
