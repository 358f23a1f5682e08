#include "meshtrain/backend/cuda/cudnn_library.h"

#include <string>

#include "meshtrain/backend/cuda/dynamic_library.h"

namespace mt::cuda {

namespace {

CudnnLibrary load() {
  const DynamicLibrary library = open_library(
      "libcudnn.so." + std::to_string(CUDNN_MAJOR), std::to_string(CUDNN_MAJOR) + "." + std::to_string(CUDNN_MINOR),
      "cuDNN's fused attention", "the CUDA toolkit's lib directory, or the nvidia-cudnn wheel's lib,");
  CudnnLibrary l{};
  auto bind = [&](const char* symbol, auto& fn) { library.bind(symbol, fn); };
  bind("cudnnGetVersion", l.GetVersion);
  bind("cudnnGetErrorString", l.GetErrorString);
  bind("cudnnGetLastErrorString", l.GetLastErrorString);
  bind("cudnnCreate", l.Create);
  bind("cudnnSetStream", l.SetStream);
  bind("cudnnBackendCreateDescriptor", l.BackendCreateDescriptor);
  bind("cudnnBackendDestroyDescriptor", l.BackendDestroyDescriptor);
  bind("cudnnBackendSetAttribute", l.BackendSetAttribute);
  bind("cudnnBackendGetAttribute", l.BackendGetAttribute);
  bind("cudnnBackendFinalize", l.BackendFinalize);
  bind("cudnnBackendExecute", l.BackendExecute);
  return l;
}

}  // namespace

const CudnnLibrary& cudnn() {
  static const CudnnLibrary library = load();  // a failed load throws, and the next call tries again
  return library;
}

}  // namespace mt::cuda
