// The Python front end's native part, `meshtrain._meshtrain` (pybind11): the engine's Array
// with NumPy conversions, the C++ ops under their own names, and value_and_grad over a flat
// {path: Array} map. The Python package (python/meshtrain/__init__.py) adds pytrees, dtypes,
// indexing and the operators' scalar forms on top; everything that computes is the C++ engine.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "meshtrain/core/host_reads.h"
#include "meshtrain/meshtrain.h"
#include "python/src/bindings.h"
#include "python/src/conversions.h"

namespace py = pybind11;
using namespace mt;
using mt::python::dict_of;
using mt::python::key_of;
using mt::python::key_tuple;
using mt::python::params_of;

namespace {

DType dtype_of_numpy(const py::dtype& dt) {
  const char kind = dt.kind();
  const size_t size = size_t(dt.itemsize());
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 2) return DType::f16;
  if ((kind == 'i' || kind == 'u') && size == 8) return DType::i64;
  if ((kind == 'i' || kind == 'u') && size == 4) return DType::i32;
  if (kind == 'b') return DType::boolean;
  throw Error(detail::concat("[array] NumPy dtype ", py::str(dt.attr("name")).cast<std::string>(),
                             " has no meshtrain dtype (float32, float16, int32, int64, bool; float64 is converted to "
                             "float32 by meshtrain.array)"));
}

py::dtype numpy_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return py::dtype::of<float>();
    case DType::f16: return py::dtype("float16");
    case DType::i32: return py::dtype::of<int32_t>();
    case DType::i64: return py::dtype::of<int64_t>();
    case DType::boolean: return py::dtype::of<bool>();
    case DType::bf16: return py::dtype("uint16");  // raw bit patterns
  }
  return py::dtype::of<float>();
}

// A C-contiguous NumPy array's bytes copied into a new Array on `device`.
Array from_numpy(const py::array& a, const std::string& device) {
  py::array c = py::array::ensure(a, py::array::c_style | py::array::forcecast);
  const DType dtype = dtype_of_numpy(c.dtype());
  std::vector<int64_t> dims(size_t(c.ndim()));
  for (py::ssize_t i = 0; i < c.ndim(); ++i) dims[size_t(i)] = int64_t(c.shape(i));
  Array host = Array::empty(Shape(dims), dtype, Device::cpu());
  if (host.nbytes() > 0) std::memcpy(host.raw(), c.data(), host.nbytes());
  return device.empty() ? host.to(current_device()) : host.to(Device::parse(device));
}

// The array's values as a new NumPy array; bf16 comes back as float32 unless `raw` (then the
// bit patterns as uint16).
py::array to_numpy(const Array& x, bool raw) {
  // A sharded array is gathered first: a collective, so every rank converts it (SPMD).
  Array host = (x.distributed() ? dist::to_host(x.detach()) : x.detach()).to(Device::cpu());
  if (host.dtype() == DType::bf16 && !raw) host = cast(host, DType::f32);
  std::vector<py::ssize_t> shape(host.shape().dims().begin(), host.shape().dims().end());
  py::array out(numpy_dtype_of(host.dtype()), shape);
  if (host.nbytes() > 0) std::memcpy(out.mutable_data(), host.raw(), host.nbytes());
  return out;
}

// value_and_grad over {path: Array}: fn receives the traced parameters as a dict and returns
// a scalar Array, or (scalar, aux) when has_aux. Returns (value, aux or None, grads dict).
py::tuple value_and_grad_flat(const py::function& fn, const std::map<std::string, Array>& params, bool with_aux) {
  const Params p = params_of(params);
  auto scalar_of = [](const py::object& r) -> Array {
    if (!py::isinstance<Array>(r))
      throw Error("[value_and_grad] the function must return a meshtrain array (a scalar), or (scalar, aux) with "
                  "has_aux=True");
    return r.cast<Array>();
  };
  py::dict grads;
  if (!with_aux) {
    auto [value, g] = mt::value_and_grad([&](const Params& q) { return scalar_of(fn(dict_of(q))); })(p);
    for (const auto& [k, v] : g) grads[py::str(k)] = v;
    return py::make_tuple(value, py::none(), grads);
  }
  auto out = mt::value_and_grad(
      [&](const Params& q) {
        py::object r = fn(dict_of(q));
        if (!py::isinstance<py::tuple>(r) || py::len(r) != 2)
          throw Error("[value_and_grad] with has_aux=True the function must return (scalar, aux)");
        py::tuple t = r.cast<py::tuple>();
        return std::pair<Array, py::object>{scalar_of(t[0]), t[1]};
      },
      mt::has_aux)(p);
  for (const auto& [k, v] : out.grads) grads[py::str(k)] = v;
  return py::make_tuple(out.value, out.aux, grads);
}

std::vector<int> axes_of(const py::object& axis) {
  if (axis.is_none()) return {};
  if (py::isinstance<py::int_>(axis)) return {axis.cast<int>()};
  return axis.cast<std::vector<int>>();
}

}  // namespace

PYBIND11_MODULE(_meshtrain, m) {
  m.doc() = "meshtrain's engine: arrays, ops and autodiff (see the meshtrain package)";
  py::register_exception<Error>(m, "Error", PyExc_ValueError);

  py::class_<Array>(m, "Array")
      .def_property_readonly("shape", [](const Array& x) { return py::tuple(py::cast(x.shape().dims())); })
      .def_property_readonly("dtype", [](const Array& x) { return std::string(dtype_name(x.dtype())); })
      .def_property_readonly("device", [](const Array& x) { return x.device().str(); })
      .def_property_readonly("sharded", &Array::distributed)
      .def_property_readonly("ndim", &Array::ndim)
      .def_property_readonly("size", &Array::numel)
      .def("item", [](const Array& x) -> py::object {
        if (x.numel() != 1) throw Error(detail::concat("[item] needs a one-element array, got ", x.str()));
        // A value laid out over a mesh is gathered first (a collective: every rank asks).
        const Array v = x.distributed() ? dist::to_host(x.detach()) : x;
        if (v.dtype() == DType::i32 || v.dtype() == DType::i64) {
          const Array h = v.to(Device::cpu());  // read as stored: exact beyond 2^53
          return py::int_(v.dtype() == DType::i64 ? h.data<int64_t>()[0] : int64_t(h.data<int32_t>()[0]));
        }
        if (v.dtype() == DType::boolean) return py::bool_(v.item() != 0);
        return py::float_(v.item());
      })
      .def("numpy", &to_numpy, py::arg("raw") = false)
      .def("detach", &Array::detach)
      .def("to", [](const Array& x, const std::string& device) { return x.to(Device::parse(device)); })
      .def("__repr__", [](const Array& x) { return "meshtrain.Array(" + x.str() + ", device=" + x.device().str() + ")"; });

  m.def("from_numpy", &from_numpy, py::arg("array"), py::arg("device") = "");
  m.def("host_read_count", &host_read_count,
        "reads of array values to the host so far (each a stream wait on a GPU)");
  m.def("cast", [](const Array& x, const std::string& dtype) { return cast(x, dtype_from_name(dtype)); });
  m.def("full", [](const std::vector<int64_t>& shape, double value, const std::string& dtype) {
    return Array::full(Shape(shape), value, dtype_from_name(dtype));
  });

  // ---- elementwise ----
#define MT_UNARY(name) m.def(#name, [](const Array& x) { return name(x); }, py::arg("x"));
  MT_UNARY(neg) MT_UNARY(exp) MT_UNARY(log) MT_UNARY(sqrt) MT_UNARY(rsqrt) MT_UNARY(tanh) MT_UNARY(abs)
  MT_UNARY(sign) MT_UNARY(square) MT_UNARY(reciprocal) MT_UNARY(erf) MT_UNARY(sin) MT_UNARY(cos) MT_UNARY(sigmoid)
  MT_UNARY(relu) MT_UNARY(silu) MT_UNARY(logical_not) MT_UNARY(stop_gradient)
#undef MT_UNARY
  m.def("gelu", [](const Array& x, bool approximate) { return gelu(x, approximate); }, py::arg("x"),
        py::arg("approximate") = false);
#define MT_BINARY(name) \
  m.def(#name, [](const Array& a, const Array& b) { return name(a, b); }, py::arg("a"), py::arg("b"));
  MT_BINARY(add) MT_BINARY(sub) MT_BINARY(mul) MT_BINARY(div) MT_BINARY(pow) MT_BINARY(maximum) MT_BINARY(minimum)
  MT_BINARY(eq) MT_BINARY(ne) MT_BINARY(lt) MT_BINARY(le) MT_BINARY(gt) MT_BINARY(ge) MT_BINARY(logical_and)
  MT_BINARY(logical_or)
#undef MT_BINARY
  m.def("where", [](const Array& c, const Array& a, const Array& b) { return where(c, a, b); });
  m.def("scalar_like", &scalar_like);

  // ---- matmul, reductions, shapes ----
  // The larger kernels let other Python threads run (the GIL released while they compute).
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("matmul", [](const Array& a, const Array& b) { return matmul(a, b); }, release);
  m.def("sum", [](const Array& x, const py::object& axis, bool keepdims) { return sum(x, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  m.def("mean", [](const Array& x, const py::object& axis, bool keepdims) { return mean(x, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  m.def("max", [](const Array& x, const py::object& axis, bool keepdims) { return max(x, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  m.def("min", [](const Array& x, const py::object& axis, bool keepdims) { return min(x, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  m.def("logsumexp",
        [](const Array& x, const py::object& axis, bool keepdims) { return logsumexp(x, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  m.def("argmax", [](const Array& x, int axis, bool keepdims) { return argmax(x, axis, keepdims); }, py::arg("x"),
        py::arg("axis") = -1, py::arg("keepdims") = false);
  m.def("reshape", [](const Array& x, const std::vector<int64_t>& shape) { return reshape(x, shape); });
  m.def("transpose", [](const Array& x, const std::vector<int>& perm) { return transpose(x, perm); });
  m.def("swapaxes", [](const Array& x, int a, int b) { return swap_axes(x, a, b); });
  m.def("slice", [](const Array& x, int axis, int64_t start, int64_t stop) { return slice(x, axis, start, stop); });
  m.def("concatenate", [](const std::vector<Array>& xs, int axis) { return concatenate(xs, axis); }, py::arg("arrays"),
        py::arg("axis") = 0);
  m.def("stack", [](const std::vector<Array>& xs, int axis) { return stack(xs, axis); }, py::arg("arrays"),
        py::arg("axis") = 0);
  m.def("broadcast_to", [](const Array& x, const std::vector<int64_t>& shape) { return broadcast_to(x, Shape(shape)); });
  m.def("expand_dims", [](const Array& x, int axis) { return expand_dims(x, axis); });
  m.def("squeeze", [](const Array& x, int axis) { return squeeze(x, axis); });
  m.def("take", [](const Array& x, const Array& indices, int axis) { return take(x, indices, axis); }, py::arg("x"),
        py::arg("indices"), py::arg("axis") = 0);
  m.def("take_along_axis", [](const Array& x, const Array& idx, int axis) { return take_along_axis(x, idx, axis); });
  m.def("one_hot", [](const Array& ids, int64_t n) { return one_hot(ids, n); });
  m.def("embedding", [](const Array& table, const Array& ids) { return embedding(table, ids); });

  // ---- nn ----
  m.def("softmax", [](const Array& x, int axis) { return softmax(x, axis); }, py::arg("x"), py::arg("axis") = -1);
  m.def("log_softmax", [](const Array& x, int axis) { return log_softmax(x, axis); }, py::arg("x"),
        py::arg("axis") = -1);
  m.def("layer_norm",
        [](const Array& x, const std::optional<Array>& w, const std::optional<Array>& b, double eps) {
          return layer_norm(x, w.value_or(Array()), b.value_or(Array()), eps);
        },
        py::arg("x"), py::arg("weight") = py::none(), py::arg("bias") = py::none(), py::arg("eps") = 1e-5, release);
  m.def("rms_norm",
        [](const Array& x, const std::optional<Array>& w, double eps) { return rms_norm(x, w.value_or(Array()), eps); },
        py::arg("x"), py::arg("weight") = py::none(), py::arg("eps") = 1e-6, release);
  m.def("cross_entropy",
        [](const Array& logits, const Array& labels, int64_t ignore_index, double label_smoothing,
           const std::string& reduction) {
          Reduction r = reduction == "mean" ? Reduction::mean : reduction == "sum" ? Reduction::sum : Reduction::none;
          if (reduction != "mean" && reduction != "sum" && reduction != "none")
            throw Error("[cross_entropy] reduction must be 'mean', 'sum' or 'none', got '" + reduction + "'");
          return cross_entropy(logits, labels, ignore_index, label_smoothing, r);
        },
        py::arg("logits"), py::arg("labels"), py::arg("ignore_index") = -100, py::arg("label_smoothing") = 0.0,
        py::arg("reduction") = "mean", release);
  m.def("mse_loss", [](const Array& a, const Array& b) { return mse_loss(a, b); });
  m.def("dropout",
        [](const Array& x, double rate, const py::object& key, bool training) {
          return dropout(x, rate, key_of(key), training);
        },
        py::arg("x"), py::arg("rate"), py::arg("key"), py::arg("training") = true);
  m.def("attention",
        [](const Array& q, const Array& k, const Array& v, const std::optional<Array>& mask, bool causal, double scale,
           double dropout_rate, const py::object& key, bool training) {
          AttentionOptions o{.causal = causal, .scale = scale, .dropout_rate = dropout_rate,
                             .dropout_key = key_of(key), .train = training};
          return scaled_dot_product_attention(q, k, v, mask.value_or(Array()), o);
        },
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask") = py::none(), py::arg("causal") = false,
        py::arg("scale") = 0.0, py::arg("dropout_rate") = 0.0, py::arg("key") = py::none(),
        py::arg("training") = false);

  // ---- random (explicit keys, as JAX) ----
  m.def("random_normal",
        [](const py::object& key, const std::vector<int64_t>& shape, const std::string& dtype) {
          return random_normal(key_of(key), Shape(shape), dtype_from_name(dtype));
        });
  m.def("random_uniform",
        [](const py::object& key, const std::vector<int64_t>& shape, const std::string& dtype, double lo, double hi) {
          return random_uniform(key_of(key), Shape(shape), dtype_from_name(dtype), lo, hi);
        });
  m.def("fold_in", [](const py::object& key, uint64_t data) {
    return key_tuple(key_of(key).fold_in(data));
  });

  // ---- autodiff ----
  m.def("value_and_grad_flat", &value_and_grad_flat, py::arg("fn"), py::arg("params"), py::arg("has_aux") = false);

  bind_toolkit(m);
  bind_models(m);
  bind_dlpack(m);
  bind_posttrain(m);
  bind_images(m);
}
