#pragma once
// PNG and JPEG decoding (Debian's libpng and libjpeg-turbo, the libraries PIL itself uses),
// converted to 8-bit RGB as PIL's Image.open(path).convert("RGB") does: grayscale is
// replicated, alpha is dropped (not composited), palettes are looked up, 16-bit RGB keeps the
// high byte and 16-bit grayscale is clipped to 255 (PIL's "I" to "RGB"). A file that is not a
// PNG or JPEG, truncated, or corrupt is an mt::Error naming it; CMYK JPEGs are refused.
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/data/image.h"

namespace mt::data {

// The format is read from the first bytes, not the name. `name` is for error messages.
Image decode_image(std::string_view bytes, const std::string& name);
Image read_image(const std::string& path);
// A batch's images, decoded in parallel (the loader thread's collate); the first unreadable
// one (in order) is the error.
std::vector<Image> read_images(const std::vector<std::string>& paths);

}  // namespace mt::data
