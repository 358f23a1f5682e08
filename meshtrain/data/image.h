#pragma once
// A decoded image as the loaders hand it on: 8-bit RGB, rows top to bottom, pixels
// interleaved (height x width x 3), the layout of PIL's "RGB" mode and of numpy.asarray on it.
#include <cstdint>
#include <string>
#include <vector>

namespace mt::data {

struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3

  uint8_t at(int64_t y, int64_t x, int c) const { return rgb[size_t((y * width + x) * 3 + c)]; }
  std::string size_str() const { return std::to_string(width) + "x" + std::to_string(height); }
};

}  // namespace mt::data
