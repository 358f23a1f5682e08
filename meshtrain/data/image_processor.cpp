#include "meshtrain/data/image_processor.h"

#include <filesystem>

#include "meshtrain/core/error.h"
#include "meshtrain/io/json.h"
#include "meshtrain/io/mapped_file.h"

namespace mt::data {

namespace {

using nlohmann::json;

template <class T>
T field(const json& j, const char* key, T fallback, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const json::exception& e) {
    throw Error(detail::concat("[image processor] ", source, ": '", key, "' has the wrong type: ", e.what()));
  }
}

std::array<float, 3> per_channel(const json& j, const char* key, std::array<float, 3> fallback, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (v.is_number()) return {v.get<float>(), v.get<float>(), v.get<float>()};
  MT_CHECK(v.is_array() && v.size() == 3 && v[0].is_number() && v[1].is_number() && v[2].is_number(),
           "[image processor] ", source, ": '", key, "' must be a number or 3 numbers (RGB), got ", v.dump());
  return {v[0].get<float>(), v[1].get<float>(), v[2].get<float>()};
}

}  // namespace

ImageProcessorConfig ImageProcessorConfig::from_json(const json& j, const std::string& source) {
  MT_CHECK(j.is_object(), "[image processor] ", source, " must hold a JSON object");
  ImageProcessorConfig c;
  c.do_resize = field(j, "do_resize", c.do_resize, source);
  if (j.contains("size") && !j["size"].is_null()) {
    const json& size = j["size"];
    if (size.is_number_integer()) {
      c.height = c.width = size.get<int64_t>();
    } else {
      MT_CHECK(size.is_object() && size.contains("height") && size.contains("width"), "[image processor] ", source,
               ": 'size' must be a number or {\"height\": H, \"width\": W} (ViT resizes to a fixed size), got ",
               size.dump());
      c.height = field<int64_t>(size, "height", 0, source);
      c.width = field<int64_t>(size, "width", 0, source);
    }
    MT_CHECK(c.height > 0 && c.width > 0, "[image processor] ", source, ": 'size' must be positive, got ", size.dump());
  }
  c.resample = resample_from_code(field(j, "resample", int(c.resample), source));
  c.do_rescale = field(j, "do_rescale", c.do_rescale, source);
  c.rescale_factor = field(j, "rescale_factor", c.rescale_factor, source);
  c.do_normalize = field(j, "do_normalize", c.do_normalize, source);
  c.image_mean = per_channel(j, "image_mean", c.image_mean, source);
  c.image_std = per_channel(j, "image_std", c.image_std, source);
  for (float s : c.image_std) MT_CHECK(s != 0.0f, "[image processor] ", source, ": 'image_std' has a zero");
  return c;
}

json ImageProcessorConfig::to_json() const {
  return {{"image_processor_type", "ViTImageProcessor"},
          {"do_resize", do_resize},
          {"size", {{"height", height}, {"width", width}}},
          {"resample", int(resample)},
          {"do_rescale", do_rescale},
          {"rescale_factor", rescale_factor},
          {"do_normalize", do_normalize},
          {"image_mean", image_mean},
          {"image_std", image_std}};
}

void save_image_processor_config(const ImageProcessorConfig& config, const std::string& model_dir) {
  io::write_file_atomic((std::filesystem::path(model_dir) / "preprocessor_config.json").string(),
                        config.to_json().dump(2) + "\n");
}

ImageProcessorConfig load_image_processor_config(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "preprocessor_config.json").string() : path;
  MT_CHECK(fs::exists(file), "[image processor] no preprocessor_config.json at ", file);
  return ImageProcessorConfig::from_json(io::read_json_file(file), file);
}

void preprocess_image(const Image& image, const ImageProcessorConfig& c, float* out) {
  const Image resized = c.do_resize ? resize_image(image, c.width, c.height, c.resample) : image;
  const int64_t plane = resized.width * resized.height;
  for (int ch = 0; ch < 3; ++ch) {
    const float mean = c.image_mean[size_t(ch)], std = c.image_std[size_t(ch)];
    float* o = out + ch * plane;
    for (int64_t i = 0; i < plane; ++i) {
      const uint8_t v = resized.rgb[size_t(i * 3 + ch)];
      float x = c.do_rescale ? float(double(v) * c.rescale_factor) : float(v);
      if (c.do_normalize) x = (x - mean) / std;
      o[i] = x;
    }
  }
}

Array pixel_values(const std::vector<Image>& images, const ImageProcessorConfig& c) {
  MT_CHECK(!images.empty(), "[image processor] no images");
  const int64_t h = c.do_resize ? c.height : images.front().height, w = c.do_resize ? c.width : images.front().width;
  for (const Image& im : images)
    MT_CHECK(c.do_resize || (im.height == h && im.width == w), "[image processor] without do_resize the images must "
             "share a size: ", images.front().size_str(), " and ", im.size_str());
  const int64_t n = int64_t(images.size());
  Array out = Array::empty(Shape{n, 3, h, w}, DType::f32, Device::cpu());
  float* p = out.data<float>();
  for (int64_t i = 0; i < n; ++i) preprocess_image(images[size_t(i)], c, p + i * 3 * h * w);
  return out;
}

}  // namespace mt::data
