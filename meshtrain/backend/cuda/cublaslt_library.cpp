#include "meshtrain/backend/cuda/cublaslt_library.h"

#include <string>

#include "meshtrain/backend/cuda/dynamic_library.h"

namespace mt::cuda {

namespace {

CublasLtLibrary load() {
  const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  const std::string headers = std::to_string(CUBLAS_VER_MAJOR) + "." + std::to_string(CUBLAS_VER_MINOR);
  void* library = open_library(name, "GPU matrix products", "the CUDA toolkit's lib64 directory, or the nvidia-cublas wheel's lib,");
  CublasLtLibrary l{};
  auto bind = [&](const char* symbol, auto& fn) { bind_symbol(library, name, symbol, headers, fn); };
  bind("cublasLtCreate", l.Create);
  bind("cublasLtMatmul", l.Matmul);
  bind("cublasLtMatmulAlgoGetHeuristic", l.MatmulAlgoGetHeuristic);
  bind("cublasLtMatmulDescCreate", l.MatmulDescCreate);
  bind("cublasLtMatmulDescDestroy", l.MatmulDescDestroy);
  bind("cublasLtMatmulDescSetAttribute", l.MatmulDescSetAttribute);
  bind("cublasLtMatmulPreferenceCreate", l.MatmulPreferenceCreate);
  bind("cublasLtMatmulPreferenceDestroy", l.MatmulPreferenceDestroy);
  bind("cublasLtMatmulPreferenceSetAttribute", l.MatmulPreferenceSetAttribute);
  bind("cublasLtMatrixLayoutCreate", l.MatrixLayoutCreate);
  bind("cublasLtMatrixLayoutDestroy", l.MatrixLayoutDestroy);
  bind("cublasLtMatrixLayoutSetAttribute", l.MatrixLayoutSetAttribute);
  return l;
}

}  // namespace

const CublasLtLibrary& cublaslt() {
  static const CublasLtLibrary library = load();  // a failed load throws, and the next call tries again
  return library;
}

}  // namespace mt::cuda
