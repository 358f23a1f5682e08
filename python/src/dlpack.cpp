// DLPack both ways (Debian's libdlpack-dev, the 0.6 ABI PyTorch speaks): an Array exports
// itself through __dlpack__/__dlpack_device__ without a copy (the capsule keeps the storage
// alive), and from_dlpack wraps another library's compact row-major tensor as an Array whose
// storage releases the producer's tensor when the last handle goes.
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include "meshtrain/core/array.h"
#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"
#if MT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#include "python/src/bindings.h"

namespace py = pybind11;
using namespace mt;

namespace {

// Waits for every stream of the GPU (the producer's, whichever it is), not only the engine's.
void synchronize_device_fully(Device device) {
#if MT_WITH_CUDA
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device.index);
  const cudaError_t err = cudaDeviceSynchronize();
  cudaSetDevice(previous);
  MT_CHECK(err == cudaSuccess, "[from_dlpack] synchronizing ", device.str(), ": ", cudaGetErrorString(err));
#else
  (void)device;
#endif
}

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

DLDataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    case DType::boolean: break;
  }
  throw Error("[dlpack] bool arrays have no type in the DLPack 0.6 ABI (PyTorch's): convert them with .numpy()");
}

DType dtype_of(const DLDataType& t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLInt && t.bits == 64) return DType::i64;
  }
  throw Error(detail::concat("[from_dlpack] DLPack type (code ", int(t.code), ", ", int(t.bits), " bits, ", int(t.lanes),
                             " lanes) has no meshtrain dtype (float32, float16, bfloat16, int32, int64)"));
}

// What an exported capsule owns: a handle on the array (its storage) and the shape DLPack
// points into.
struct Export {
  Array array;
  std::vector<int64_t> shape;
  DLManagedTensor tensor{};
};

py::capsule to_dlpack(const Array& x) {
  MT_CHECK(!x.distributed(), "[dlpack] ", x.str(), " is sharded over a mesh: gather it first (dist::to_host)");
  const DLDataType dtype = dl_dtype(x.dtype());  // before anything is allocated: bool throws
  // The consumer reads on its own stream: the kernels that write x must be done first.
  synchronize(x.device());
  auto* e = new Export{x.detach(), x.shape().dims(), {}};
  DLTensor& t = e->tensor.dl_tensor;
  t.data = e->array.raw();
  t.device = x.device().is_cuda() ? DLDevice{kDLCUDA, x.device().index} : DLDevice{kDLCPU, 0};
  t.ndim = int32_t(e->shape.size());
  t.dtype = dtype;
  t.shape = e->shape.data();
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  e->tensor.manager_ctx = e;
  e->tensor.deleter = [](DLManagedTensor* m) { delete static_cast<Export*>(m->manager_ctx); };
  // A capsule nobody consumed frees its tensor; a consumer renames it and owns the tensor.
  return py::capsule(&e->tensor, kCapsuleName, [](PyObject* cap) {
    if (!PyCapsule_IsValid(cap, kCapsuleName)) return;
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kCapsuleName));
    if (m && m->deleter) m->deleter(m);
  });
}

Array from_dlpack(const py::object& obj) {
  py::object cap = py::hasattr(obj, "__dlpack__") ? obj.attr("__dlpack__")() : obj;
  PyObject* raw = cap.ptr();
  MT_CHECK(PyCapsule_IsValid(raw, kCapsuleName),
           "[from_dlpack] expected an object with __dlpack__ or an unused 'dltensor' capsule");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(raw, kCapsuleName));
  const DLTensor& t = m->dl_tensor;
  const DType dtype = dtype_of(t.dtype);
  std::vector<int64_t> dims(t.shape, t.shape + t.ndim);
  if (t.strides) {
    int64_t expected = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      MT_CHECK(dims[size_t(d)] == 1 || t.strides[d] == expected, "[from_dlpack] tensor of shape ", Shape(dims).str(),
               " is not compact row-major (call .contiguous() on it first)");
      expected *= dims[size_t(d)];
    }
  }
  Device device;
  if (t.device.device_type == kDLCUDA) device = Device::cuda(t.device.device_id);
  else MT_CHECK(t.device.device_type == kDLCPU, "[from_dlpack] device type ", int(t.device.device_type),
                " is neither the CPU nor CUDA");
  auto impl = std::make_shared<ArrayImpl>();
  impl->shape = Shape(dims);
  impl->dtype = dtype;
  impl->device = device;
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  // The producer's kernels may still be writing it on their stream (unknown to this engine):
  // wait for the whole device before the engine's own stream reads it.
  if (device.is_cuda()) synchronize_device_fully(device);
  impl->storage = std::shared_ptr<void>(data, [m](void*) {
    if (m->deleter) m->deleter(m);
  });
  PyCapsule_SetName(raw, kUsedCapsuleName);
  return Array(impl);
}

}  // namespace

void bind_dlpack(py::module_& m) {
  m.def("to_dlpack", &to_dlpack, py::arg("array"));
  m.def("from_dlpack", &from_dlpack, py::arg("tensor"));
  m.def("dlpack_device", [](const Array& x) {
    return x.device().is_cuda() ? py::make_tuple(int(kDLCUDA), x.device().index) : py::make_tuple(int(kDLCPU), 0);
  });
  m.def("data_ptr", [](const Array& x) { return reinterpret_cast<uintptr_t>(x.raw()); });
}
