#pragma once
#include <initializer_list>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/device.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/core/layout.h"
#include "meshtrain/core/shape.h"

namespace mt {

namespace autodiff {
struct Node;
}

// The state behind an Array handle. Several handles (and reshape views) may share
// `storage`; `node` is set when the array is traced by an enclosing value_and_grad.
// With a `layout`, `shape` is the global shape and `storage` holds this rank's block.
struct ArrayImpl {
  Shape shape;
  DType dtype = DType::f32;
  std::shared_ptr<void> storage;
  size_t offset_bytes = 0;
  std::shared_ptr<autodiff::Node> node;
  std::shared_ptr<const Layout> layout;
  Device device;  // where `storage` lives
  // `storage` came from Array::empty (a caching allocator), not from a file mapping or a
  // caller's buffer, so a kernel may overwrite it when nothing else can observe it.
  bool allocated = false;
};

// A cheap shared handle to a row-major, contiguous n-d array.
class Array {
 public:
  Array() = default;
  explicit Array(std::shared_ptr<ArrayImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialized storage from the caching allocator of the current device (core/device.h),
  // or of `device`.
  static Array empty(const Shape& shape, DType dtype = DType::f32);
  static Array empty(const Shape& shape, DType dtype, Device device);
  static Array zeros(const Shape& shape, DType dtype = DType::f32);
  static Array zeros(const Shape& shape, DType dtype, Device device);
  static Array ones(const Shape& shape, DType dtype = DType::f32);
  static Array full(const Shape& shape, double value, DType dtype = DType::f32);
  static Array full(const Shape& shape, double value, DType dtype, Device device);
  static Array scalar(double value, DType dtype = DType::f32);
  static Array scalar(double value, DType dtype, Device device);
  // Factories create on the current device. Copies host values, converting them to `dtype` (bf16/f16 round to nearest even).
  static Array from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32);
  static Array from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32);
  static Array from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64);
  static Array from_vector(const std::vector<int32_t>& values, const Shape& shape, DType dtype = DType::i32);

  bool defined() const { return impl_ != nullptr; }
  // Distributed over a mesh (shape() is then global; the buffer holds this rank's block).
  bool sharded() const { return impl_ && impl_->layout != nullptr; }
  // Distributed over more than one rank in a non-trivial layout (split or partial).
  bool distributed() const { return sharded() && !impl_->layout->is_trivial(); }
  const Shape& shape() const { return impl_->shape; }
  int ndim() const { return impl_->shape.ndim(); }
  int64_t numel() const { return impl_->shape.numel(); }
  int64_t dim(int i) const { return impl_->shape.dim(i); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }

  void* raw() const { return static_cast<char*>(impl_->storage.get()) + impl_->offset_bytes; }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Host copies converted to the requested element type (any source dtype); a device array
  // is copied to the host first (waiting for the kernels that produce it). A sharded
  // array must first be gathered with dist::to_host.
  std::vector<float> to_floats() const;
  std::vector<double> to_doubles() const;
  std::vector<int64_t> to_ints() const;
  double item() const;  // the single element of a one-element array

  // Overwrites this array's nbytes() with `host`'s, in place: on a GPU a copy ordered after
  // the kernels already enqueued (they read the old values). For small per-step values that
  // kernels read from memory rather than from their launch (a captured step's scalars).
  void write_from_host(const void* host) const;
  // Overwrites this array's values with `source`'s (same shape, dtype and device), in place,
  // ordered like write_from_host: a captured step's static inputs take each batch this way.
  void copy_from(const Array& source) const;

  // Same storage, no autodiff history.
  Array detach() const;
  // Storage copy on the same device (no history).
  Array clone() const;
  // A copy on `device` (no history); this array itself when it is already there.
  Array to(Device device) const;
  bool traced() const { return impl_ && impl_->node != nullptr; }
  // A view with another shape of the same numel; does not record autodiff history
  // (ops::reshape does).
  Array view_as_shape(const Shape& shape) const;
  // x[i] along the first dim as a view of the same storage (no history, not sharded): for
  // kernels that write several results into one buffer (optimizer moments).
  Array view_row(int64_t i) const;
  bool shares_storage(const Array& o) const { return impl_->storage == o.impl_->storage; }
  // This handle is the only way to reach its storage: no other handle, view or autodiff
  // node, no layout, and the storage is the allocator's. A kernel given such an input (it
  // can only be one moved into the call) may write its output there: nobody can tell.
  bool sole_owner() const { return sole_owners({this}); }
  // The same for several handles together (e.g. the rows of one buffer): each is the only
  // handle to its view, and these views are the only ones of their shared storage.
  static bool sole_owners(std::initializer_list<const Array*> handles);
  static bool sole_owners(const std::vector<const Array*>& handles);
  // Elements [offset, offset + shape.numel()) of this flat (1-d) array, as a view of the
  // same storage with `shape` (no history): the per-tensor pieces of a multi-tensor result.
  Array view_elements(int64_t offset, const Shape& shape) const;

  const std::shared_ptr<ArrayImpl>& impl() const { return impl_; }
  std::string str() const;  // "f32(2, 3)"
  std::string repr(int max_elements = 16) const;  // values, for debugging and messages

 private:
  std::shared_ptr<ArrayImpl> impl_;
};

}  // namespace mt
