#include "meshtrain/core/array.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/element.h"

namespace mt {

Array Array::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) MT_CHECK(d >= 0, "[empty] negative dimension in shape ", shape.str());
  auto impl = std::make_shared<ArrayImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = CachingAllocator::instance().allocate(size_t(shape.numel()) * dtype_size(dtype));
  return Array(std::move(impl));
}

Array Array::full(const Shape& shape, double value, DType dtype) {
  Array a = empty(shape, dtype);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v = from_double<T>(value);
    T* p = a.data<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) p[i] = v;
  });
  return a;
}

Array Array::zeros(const Shape& shape, DType dtype) {
  Array a = empty(shape, dtype);
  std::memset(a.raw(), 0, a.nbytes());
  return a;
}

Array Array::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Array Array::scalar(double value, DType dtype) { return full(Shape{}, value, dtype); }

namespace {
template <class Src>
Array from_host(const std::vector<Src>& values, const Shape& shape, DType dtype) {
  MT_CHECK(int64_t(values.size()) == shape.numel(), "[from_vector] ", values.size(),
           " values do not fill shape ", shape.str());
  Array a = Array::empty(shape, dtype);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = a.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = from_double<T>(double(values[i]));
  });
  return a;
}
template <class Dst>
std::vector<Dst> to_host(const Array& a) {
  MT_CHECK(!a.sharded(), "[to_host] ", a.str(), " is sharded: gather it with dist::to_host first");
  std::vector<Dst> out(size_t(a.numel()));
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = a.data<T>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = Dst(to_double(p[i]));
  });
  return out;
}
}  // namespace

Array Array::from_vector(const std::vector<float>& v, const Shape& s, DType d) { return from_host(v, s, d); }
Array Array::from_vector(const std::vector<double>& v, const Shape& s, DType d) { return from_host(v, s, d); }
Array Array::from_vector(const std::vector<int64_t>& v, const Shape& s, DType d) { return from_host(v, s, d); }
Array Array::from_vector(const std::vector<int32_t>& v, const Shape& s, DType d) { return from_host(v, s, d); }

std::vector<float> Array::to_floats() const { return to_host<float>(*this); }
std::vector<double> Array::to_doubles() const { return to_host<double>(*this); }
std::vector<int64_t> Array::to_ints() const { return to_host<int64_t>(*this); }

double Array::item() const {
  MT_CHECK(numel() == 1, "[item] expected one element, got shape ", shape().str());
  return to_doubles()[0];
}

Array Array::detach() const {
  auto impl = std::make_shared<ArrayImpl>(*impl_);
  impl->node = nullptr;
  return Array(std::move(impl));
}

Array Array::clone() const {
  MT_CHECK(!sharded(), "[clone] ", str(), " is sharded");
  Array out = empty(shape(), dtype());
  std::memcpy(out.raw(), raw(), nbytes());
  return out;
}

Array Array::view_as_shape(const Shape& shape) const {
  MT_CHECK(shape.numel() == numel(), "[reshape] cannot view ", str(), " as shape ", shape.str());
  MT_CHECK(!sharded(), "[reshape] ", str(), " is sharded: views apply to local blocks");
  auto impl = std::make_shared<ArrayImpl>(*impl_);
  impl->shape = shape;
  impl->node = nullptr;
  return Array(std::move(impl));
}

Array Array::view_row(int64_t i) const {
  MT_CHECK(ndim() >= 1 && i >= 0 && i < dim(0), "[view_row] row ", i, " outside ", str());
  MT_CHECK(!sharded(), "[view_row] ", str(), " is sharded: views apply to local blocks");
  auto impl = std::make_shared<ArrayImpl>(*impl_);
  impl->shape = Shape(std::vector<int64_t>(shape().dims().begin() + 1, shape().dims().end()));
  impl->offset_bytes += size_t(i) * (nbytes() / size_t(dim(0)));
  impl->node = nullptr;
  return Array(std::move(impl));
}

std::string Array::str() const {
  if (!defined()) return "<undefined>";
  return std::string(dtype_name(dtype())) + shape().str();
}

std::string Array::repr(int max_elements) const {
  std::ostringstream os;
  os << str() << " [";
  auto v = to_doubles();
  for (size_t i = 0; i < v.size() && int(i) < max_elements; ++i) os << (i ? ", " : "") << v[i];
  if (int64_t(v.size()) > max_elements) os << ", ...";
  os << "]";
  return os.str();
}

}  // namespace mt
