#pragma once
// Image-caption data as the captioning pipeline reads it (issue 47), in either of the two
// layouts people keep it in:
//   JSON lines, one {"image": "<file>", "caption": "<text>"} per line ("captions": [...] for
//     several), rows naming the same image merged;
//   COCO's captions file: {"images": [{"id", "file_name"}, ...],
//     "annotations": [{"image_id", "caption"}, ...]}, several references per image.
// Image files are relative to an image directory. Errors name the file, its line (JSON lines)
// or entry (COCO) and the missing field; images the directory lacks are listed.
#include <cstddef>
#include <string>
#include <vector>

namespace mt::data {

struct CaptionedImage {
  std::string image;                  // the file's path: image_dir / the listed name
  std::vector<std::string> captions;  // every reference, in file order
};

// The layout is read from the content (one JSON object with "images" and "annotations" is
// COCO's). Images keep the order of their first mention.
std::vector<CaptionedImage> read_captions(const std::string& path, const std::string& image_dir);

// Decodes every image (in parallel) to find unreadable ones before any training. `skip`:
// drop them and count them in `*skipped`; otherwise the first one (in order) is an error
// naming its file and how many more there are.
enum class BadImages { stop, skip };
std::vector<CaptionedImage> check_images(std::vector<CaptionedImage> images, BadImages policy,
                                         size_t* skipped = nullptr);

}  // namespace mt::data
