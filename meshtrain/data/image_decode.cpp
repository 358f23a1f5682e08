#include "meshtrain/data/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>
#include <algorithm>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include "meshtrain/core/error.h"

namespace mt::data {

namespace {

bool is_png(std::string_view b) { return b.size() >= 8 && png_sig_cmp(reinterpret_cast<png_const_bytep>(b.data()), 0, 8) == 0; }
bool is_jpeg(std::string_view b) {
  return b.size() >= 3 && uint8_t(b[0]) == 0xFF && uint8_t(b[1]) == 0xD8 && uint8_t(b[2]) == 0xFF;
}

// ---- PNG -------------------------------------------------------------------------------
// libpng reports errors by longjmp: the functions holding its jmp_buf keep only plain locals,
// and the message is carried out in this struct.
struct PngSource {
  std::string_view bytes;
  size_t offset = 0;
  char error[256] = {0};
};

void png_read_from(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->offset + n > src->bytes.size()) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, src->bytes.data() + src->offset, n);
  src->offset += n;
}

void png_error_to(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->error, sizeof(src->error), "%s", message);
  png_longjmp(png, 1);
}

void png_warning_ignored(png_structp, png_const_charp) {}

// Decodes into `image`; returns false with src.error set on failure.
bool decode_png(PngSource& src, Image& image) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_error_to, png_warning_ignored);
  if (!png) {
    std::snprintf(src.error, sizeof(src.error), "libpng could not start");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  // Set after setjmp and freed by its handler: volatile, so their values survive the longjmp.
  png_bytep* volatile rows = nullptr;
  std::vector<uint16_t>* volatile wide = nullptr;
  if (setjmp(png_jmpbuf(png))) {
    delete[] rows;
    delete wide;
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &src, png_read_from);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info), height = png_get_image_height(png, info);
  const int depth = png_get_bit_depth(png, info), color = png_get_color_type(png, info);
  const bool gray = (color & PNG_COLOR_MASK_COLOR) == 0;
  // PIL opens 16-bit grayscale as mode "I" (0..65535), whose conversion to RGB clips at 255.
  const bool clip16 = depth == 16 && gray;
  png_set_expand(png);  // palette -> RGB, gray < 8 bits -> 8 bits (scaled), tRNS -> alpha
  if (!clip16) png_set_strip_16(png);  // the high byte, as PIL's 16-bit rawmodes
  else png_set_swap(png);              // host-order 16-bit words
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  image.width = width, image.height = height;
  image.rgb.assign(size_t(width) * height * 3, 0);
  rows = new png_bytep[height];
  if (!clip16) {
    for (png_uint_32 y = 0; y < height; ++y) rows[y] = image.rgb.data() + size_t(y) * width * 3;
  } else {
    wide = new std::vector<uint16_t>(size_t(height) * row_bytes / 2);
    for (png_uint_32 y = 0; y < height; ++y) rows[y] = reinterpret_cast<png_bytep>(wide->data() + size_t(y) * row_bytes / 2);
  }
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  if (wide) {
    const std::vector<uint16_t>& words = *wide;
    for (size_t i = 0; i < image.rgb.size(); ++i) image.rgb[i] = uint8_t(std::min<uint16_t>(words[i], 255));
  }
  delete[] rows;
  delete wide;
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// ---- JPEG ------------------------------------------------------------------------------
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char error[JMSG_LENGTH_MAX] = {0};
  bool truncated = false;
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->error);
  std::longjmp(e->jump, 1);
}

// Warnings pass, except the end of data before the image's end: PIL refuses a truncated file.
void jpeg_message(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;
}

bool decode_jpeg(std::string_view bytes, Image& image, JpegErrors& errors) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_error_exit;
  errors.mgr.emit_message = jpeg_message;
  // No object with a destructor lives in this frame across the longjmp: the line buffer is a
  // plain allocation its handler frees.
  uint8_t* volatile line = nullptr;
  if (setjmp(errors.jump)) {
    delete[] line;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(errors.error, sizeof(errors.error), "a CMYK JPEG (convert it to RGB first)");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  // PIL's defaults: the accurate integer DCT and fancy upsampling, as the library's.
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const JDIMENSION width = cinfo.output_width, height = cinfo.output_height;
  image.width = width, image.height = height;
  image.rgb.assign(size_t(width) * height * 3, 0);
  const size_t line_bytes = size_t(width) * (gray ? 1 : 3);
  line = new uint8_t[line_bytes];
  while (cinfo.output_scanline < height) {
    const JDIMENSION y = cinfo.output_scanline;
    JSAMPROW row = line;
    jpeg_read_scanlines(&cinfo, &row, 1);
    uint8_t* out = image.rgb.data() + size_t(y) * width * 3;
    if (gray) {
      for (JDIMENSION x = 0; x < width; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = line[x];
    } else {
      std::memcpy(out, line, line_bytes);
    }
  }
  jpeg_finish_decompress(&cinfo);
  delete[] line;
  jpeg_destroy_decompress(&cinfo);
  return true;
}

}  // namespace

Image decode_image(std::string_view bytes, const std::string& name) {
  Image image;
  if (is_png(bytes)) {
    PngSource src{bytes};
    if (!decode_png(src, image)) throw Error(detail::concat("[image] ", name, ": not a readable PNG: ", src.error));
    return image;
  }
  if (is_jpeg(bytes)) {
    JpegErrors errors;
    const bool ok = decode_jpeg(bytes, image, errors);
    if (!ok) throw Error(detail::concat("[image] ", name, ": not a readable JPEG: ", errors.error));
    if (errors.truncated) throw Error(detail::concat("[image] ", name, ": the JPEG data ends early (truncated)"));
    return image;
  }
  throw Error(detail::concat("[image] ", name, ": not a PNG or JPEG file (", bytes.size(), " bytes)"));
}

Image read_image(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in, "[image] cannot open ", path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return decode_image(bytes, path);
}

std::vector<Image> read_images(const std::vector<std::string>& paths) {
  std::vector<Image> images(paths.size());
  std::vector<std::string> errors(paths.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < int64_t(paths.size()); ++i) {
    try {
      images[size_t(i)] = read_image(paths[size_t(i)]);
    } catch (const std::exception& e) {
      errors[size_t(i)] = e.what();
    }
  }
  for (const std::string& e : errors) MT_CHECK(e.empty(), e);
  return images;
}

}  // namespace mt::data
