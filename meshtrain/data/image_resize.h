#pragma once
// Image resizing with PIL's arithmetic (Image.resize without reducing_gap), so that
// preprocessing equals what Hugging Face's image processors compute through PIL: a separable
// convolution, horizontal pass first, whose filter widens with the downscaling factor
// (antialiasing), coefficients normalized in double and applied in 22-bit fixed point, each
// pass rounded and clipped to 8 bits. NEAREST samples the pixel under each output centre.
#include <cstdint>
#include <string>

#include "meshtrain/data/image.h"

namespace mt::data {

// PIL's Resampling codes, as preprocessor_config.json stores them.
enum class Resample { nearest = 0, lanczos = 1, bilinear = 2, bicubic = 3, box = 4, hamming = 5 };

// Throws naming the code unless it is 0..5.
Resample resample_from_code(int code);
const char* resample_name(Resample r);

Image resize_image(const Image& image, int64_t width, int64_t height, Resample resample);

}  // namespace mt::data
