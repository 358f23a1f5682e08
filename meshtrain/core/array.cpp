#include "meshtrain/core/array.h"

#include <atomic>

#include <cmath>
#include <cstring>
#include <sstream>
#include <type_traits>

#include "meshtrain/core/allocator.h"
#include "meshtrain/core/host_reads.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/element.h"

namespace mt {

Array Array::empty(const Shape& shape, DType dtype) { return empty(shape, dtype, current_device()); }

Array Array::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) MT_CHECK(d >= 0, "[empty] negative dimension in shape ", shape.str());
  auto impl = std::make_shared<ArrayImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->device = device;
  impl->allocated = true;
  const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
  if (device.is_cpu()) {
    impl->storage = CachingAllocator::instance().allocate(bytes);
  } else {
    try {
      impl->storage = cuda_runtime().allocate(device.index, bytes);
    } catch (const Error& e) {
      throw Error(detail::concat("[empty] cannot allocate ", dtype_name(dtype), shape.str(), " on ", device.str(),
                                 ": ", e.what()));
    }
  }
  return Array(std::move(impl));
}

Array Array::full(const Shape& shape, double value, DType dtype) { return full(shape, value, dtype, current_device()); }

Array Array::full(const Shape& shape, double value, DType dtype, Device device) {
  Array a = empty(shape, dtype, device);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v = from_double<T>(value);
    if (a.device().is_cuda()) {
      cuda_runtime().fill_bytes(a.raw(), &v, sizeof(T), size_t(a.numel()));
      return;
    }
    T* p = a.data<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) p[i] = v;
  });
  return a;
}

Array Array::zeros(const Shape& shape, DType dtype) { return zeros(shape, dtype, current_device()); }

Array Array::zeros(const Shape& shape, DType dtype, Device device) {
  Array a = empty(shape, dtype, device);
  if (a.device().is_cuda()) {
    const uint8_t zero = 0;
    cuda_runtime().fill_bytes(a.raw(), &zero, 1, a.nbytes());
  } else {
    std::memset(a.raw(), 0, a.nbytes());
  }
  return a;
}

Array Array::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Array Array::scalar(double value, DType dtype) { return full(Shape{}, value, dtype); }
Array Array::scalar(double value, DType dtype, Device device) { return full(Shape{}, value, dtype, device); }

namespace {
std::atomic<uint64_t> g_host_reads{0};
// Per thread: the data loader's threads upload the next batches while a step runs; a step (and
// a graph captured from it) answers only for its own thread's.
thread_local uint64_t t_host_uploads = 0, t_host_writes = 0;

template <class Src>
Array from_host(const std::vector<Src>& values, const Shape& shape, DType dtype) {
  // Counted here on the CPU build; to() counts the copy to a GPU.
  if (!current_device().is_cuda()) ++t_host_uploads;
  MT_CHECK(int64_t(values.size()) == shape.numel(), "[from_vector] ", values.size(),
           " values do not fill shape ", shape.str());
  Array a = Array::empty(shape, dtype, Device::cpu());
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = a.data<T>();
    for (size_t i = 0; i < values.size(); ++i) {
      if constexpr (std::is_integral_v<T> && std::is_integral_v<Src>) p[i] = T(values[i]);  // exact, as in to_host
      else p[i] = from_double<T>(double(values[i]));
    }
  });
  return a.to(current_device());
}

template <class Dst>
std::vector<Dst> to_host(const Array& a) {
  MT_CHECK(!a.sharded(), "[to_host] ", a.str(), " is sharded: gather it with dist::to_host first");
  if (!a.device().is_cuda()) g_host_reads.fetch_add(1, std::memory_order_relaxed);  // a device copy counts in to()
  std::vector<Dst> out(size_t(a.numel()));
  const Array host = a.to(Device::cpu());
  dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = host.data<T>();
    // Integers convert directly: through a double, int64 values past 2^53 round, and INT64_MAX
    // (the index checks' "no bad index") would overflow back to INT64_MIN.
    for (size_t i = 0; i < out.size(); ++i) {
      if constexpr (std::is_integral_v<T> && std::is_integral_v<Dst>) out[i] = Dst(p[i]);
      else out[i] = Dst(to_double(p[i]));
    }
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
  Array out = empty(shape(), dtype(), device());
  if (device().is_cuda())
    cuda_runtime().copy_on_device(out.raw(), raw(), nbytes());
  else
    std::memcpy(out.raw(), raw(), nbytes());
  return out;
}

Array Array::to(Device target) const {
  MT_CHECK(!sharded() || !distributed(), "[to] ", str(), " is distributed: move its blocks, not the global array");
  if (device() == target) return *this;
  Array out = empty(shape(), dtype(), target);
  out.impl()->layout = impl_->layout;  // a trivial (one-rank) layout travels with the values
  if (nbytes() == 0) return out;
  if (target.is_cpu()) {
    g_host_reads.fetch_add(1, std::memory_order_relaxed);
    cuda_runtime().copy_to_host(out.raw(), raw(), nbytes());
  }
  else if (device().is_cpu()) {
    ++t_host_uploads;
    cuda_runtime().copy_from_host(out.raw(), raw(), nbytes());
  }
  else
    cuda_runtime().copy_on_device(out.raw(), raw(), nbytes());
  return out;
}

void Array::write_from_host(const void* host) const {
  MT_CHECK(!sharded(), "[write_from_host] ", str(), " is sharded: write its local block");
  if (nbytes() == 0) return;
  ++t_host_writes;
  if (device().is_cpu())
    std::memcpy(raw(), host, nbytes());
  else
    cuda_runtime().copy_from_host(raw(), host, nbytes());
}

void Array::copy_from(const Array& source) const {
  MT_CHECK(!sharded() && !source.sharded(), "[copy_from] ", str(), " <- ", source.str(), ": sharded arrays copy blocks");
  MT_CHECK(shape() == source.shape() && dtype() == source.dtype(), "[copy_from] cannot write ", source.str(), " into ",
           str());
  MT_CHECK(device() == source.device(), "[copy_from] ", source.str(), " is on ", source.device().str(), ", not on ",
           device().str());
  if (nbytes() == 0 || raw() == source.raw()) return;
  if (device().is_cuda())
    cuda_runtime().copy_on_device(raw(), source.raw(), nbytes());
  else
    std::memmove(raw(), source.raw(), nbytes());
}

Array Array::view_as_shape(const Shape& shape) const {
  MT_CHECK(shape.numel() == numel(), "[reshape] cannot view ", str(), " as shape ", shape.str());
  MT_CHECK(!sharded(), "[reshape] ", str(), " is sharded: views apply to local blocks");
  auto impl = std::make_shared<ArrayImpl>(*impl_);
  impl->shape = shape;
  impl->node = nullptr;
  return Array(std::move(impl));
}

bool Array::sole_owners(std::initializer_list<const Array*> handles) {
  return sole_owners(std::vector<const Array*>(handles));
}

bool Array::sole_owners(const std::vector<const Array*>& handles) {
  if (handles.empty()) return false;
  const std::shared_ptr<ArrayImpl>& first = (*handles.begin())->impl_;
  if (!first || !first->allocated || first->storage.use_count() != long(handles.size())) return false;
  for (const Array* a : handles) {
    const std::shared_ptr<ArrayImpl>& impl = a->impl_;
    if (!impl || impl.use_count() != 1 || impl->storage != first->storage || impl->node || impl->layout) return false;
  }
  return true;
}

Array Array::view_elements(int64_t offset, const Shape& shape) const {
  MT_CHECK(ndim() == 1 && offset >= 0 && offset + shape.numel() <= numel(), "[view_elements] elements ", offset,
           "..", offset + shape.numel(), " outside ", str());
  MT_CHECK(!sharded(), "[view_elements] ", str(), " is sharded: views apply to local blocks");
  auto impl = std::make_shared<ArrayImpl>(*impl_);
  impl->shape = shape;
  impl->offset_bytes += size_t(offset) * dtype_size(dtype());
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

namespace mt {
uint64_t host_read_count() { return g_host_reads.load(std::memory_order_relaxed); }
uint64_t host_upload_count() { return t_host_uploads; }
uint64_t host_write_count() { return t_host_writes; }
}  // namespace mt
