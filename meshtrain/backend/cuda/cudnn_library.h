#pragma once
// cuDNN's graph (backend) API, loaded the first time an attention asks for it (dlopen) rather
// than linked, as cuBLASLt is (cublaslt_library.h): a process that never takes the cuDNN route
// (every CPU run, every f32 attention) maps none of its libraries, and a machine without cuDNN
// runs the attention's own kernels instead.
#include <cudnn_graph.h>

namespace mt::cuda {

// The entry points the attention graphs use (backend/cuda/cudnn_graph.h).
struct CudnnLibrary {
  decltype(&cudnnGetVersion) GetVersion;
  decltype(&cudnnGetErrorString) GetErrorString;
  decltype(&cudnnGetLastErrorString) GetLastErrorString;
  decltype(&cudnnCreate) Create;
  decltype(&cudnnSetStream) SetStream;
  decltype(&cudnnBackendCreateDescriptor) BackendCreateDescriptor;
  decltype(&cudnnBackendDestroyDescriptor) BackendDestroyDescriptor;
  decltype(&cudnnBackendSetAttribute) BackendSetAttribute;
  decltype(&cudnnBackendGetAttribute) BackendGetAttribute;
  decltype(&cudnnBackendFinalize) BackendFinalize;
  decltype(&cudnnBackendExecute) BackendExecute;
};

// Loads libcudnn.so.<major of the headers built against> once; throws mt::Error naming the
// library and the loader's reason when it cannot be found or lacks an entry point.
const CudnnLibrary& cudnn();

}  // namespace mt::cuda
