// Images from Python: decoding (PNG, JPEG as PIL's convert("RGB")) to NumPy's (H, W, 3) uint8
// layout, and ViTImageProcessor's arithmetic turning such arrays into a batch's pixel_values,
// so a Python collate gets the same pixels as the C++ pipeline and transformers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/data/image_decode.h"
#include "meshtrain/data/image_processor.h"
#include "python/src/bindings.h"

namespace py = pybind11;
using namespace mt;

namespace {

py::array_t<uint8_t> numpy_of(const data::Image& im) {
  py::array_t<uint8_t> out({im.height, im.width, int64_t(3)});
  std::memcpy(out.mutable_data(), im.rgb.data(), im.rgb.size());
  return out;
}

// An (H, W, 3) uint8 array (any strides; a PIL image through np.asarray) as an Image.
data::Image image_of(const py::handle& obj, size_t index) {
  auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(obj);
  MT_CHECK(a, "[image_processor] image ", index, " is not an array of pixels");
  std::string shape;
  for (py::ssize_t k = 0; k < a.ndim(); ++k) shape += (k ? ", " : "") + std::to_string(a.shape(k));
  MT_CHECK(a.ndim() == 3 && a.shape(2) == 3 && a.shape(0) > 0 && a.shape(1) > 0, "[image_processor] image ", index,
           " must be (height, width, 3) RGB uint8, got shape (", shape, ")");
  data::Image im;
  im.height = a.shape(0), im.width = a.shape(1);
  im.rgb.assign(a.data(), a.data() + a.size());
  return im;
}

data::Resample resample_of(const std::string& name) {
  for (data::Resample r : {data::Resample::nearest, data::Resample::lanczos, data::Resample::bilinear,
                           data::Resample::bicubic, data::Resample::box, data::Resample::hamming})
    if (name == data::resample_name(r)) return r;
  throw Error("[image_processor] unknown resample '" + name + "' (nearest, bilinear, bicubic, lanczos, box, hamming)");
}

}  // namespace

void bind_images(py::module_& m) {
  py::module_ d = m.def_submodule("data", "image decoding and ViTImageProcessor's preprocessing");
  d.def("read_image", [](const std::string& path) { return numpy_of(data::read_image(path)); }, py::arg("path"),
        "a PNG or JPEG file as (height, width, 3) uint8 RGB, as PIL's Image.open(path).convert('RGB')");
  d.def("decode_image",
        [](const py::bytes& bytes, const std::string& name) { return numpy_of(data::decode_image(std::string(bytes), name)); },
        py::arg("data"), py::arg("name") = "<bytes>", "PNG or JPEG bytes as (height, width, 3) uint8 RGB");

  py::class_<data::ImageProcessorConfig>(d, "ImageProcessor",
                                         "ViTImageProcessor: resize (PIL's filters), rescale by 1/255, normalize")
      .def(py::init([](py::object size, const std::string& resample, bool do_resize, bool do_rescale,
                       double rescale_factor, bool do_normalize, std::array<float, 3> mean, std::array<float, 3> std) {
             data::ImageProcessorConfig c;
             if (py::isinstance<py::int_>(size)) {
               c.height = c.width = size.cast<int64_t>();
             } else {
               auto hw = size.cast<std::pair<int64_t, int64_t>>();
               c.height = hw.first, c.width = hw.second;
             }
             MT_CHECK(c.height > 0 && c.width > 0, "[image_processor] size must be positive, got ", c.height, "x", c.width);
             c.resample = resample_of(resample);
             c.do_resize = do_resize, c.do_rescale = do_rescale, c.rescale_factor = rescale_factor;
             c.do_normalize = do_normalize, c.image_mean = mean, c.image_std = std;
             return c;
           }),
           py::arg("size") = 224, py::arg("resample") = "bilinear", py::arg("do_resize") = true,
           py::arg("do_rescale") = true, py::arg("rescale_factor") = 1.0 / 255.0, py::arg("do_normalize") = true,
           py::arg("image_mean") = std::array<float, 3>{0.5f, 0.5f, 0.5f},
           py::arg("image_std") = std::array<float, 3>{0.5f, 0.5f, 0.5f})
      .def_static("from_pretrained", &data::load_image_processor_config, py::arg("path"),
                  "a model folder's preprocessor_config.json (or the file)")
      .def_property_readonly("size", [](const data::ImageProcessorConfig& c) { return py::make_tuple(c.height, c.width); })
      .def_property_readonly("resample", [](const data::ImageProcessorConfig& c) { return data::resample_name(c.resample); })
      .def("to_json_string", [](const data::ImageProcessorConfig& c) { return c.to_json().dump(2); })
      .def(
          "__call__",
          [](const data::ImageProcessorConfig& c, const py::sequence& images) {
            std::vector<data::Image> v;
            for (size_t i = 0; i < images.size(); ++i) v.push_back(image_of(images[i], i));
            MT_CHECK(!v.empty(), "[image_processor] no images");
            py::gil_scoped_release release;
            return data::pixel_values(v, c);
          },
          py::arg("images"), "pixel_values (N, 3, height, width) float32 of (H, W, 3) uint8 images");
}
