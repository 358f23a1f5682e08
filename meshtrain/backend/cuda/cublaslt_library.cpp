#include "meshtrain/backend/cuda/cublaslt_library.h"

#include <string>

#include "meshtrain/backend/cuda/dynamic_library.h"

namespace mt::cuda {

namespace {

CublasLtLibrary load() {
  const DynamicLibrary library =
      open_library("libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR),
                   std::to_string(CUBLAS_VER_MAJOR) + "." + std::to_string(CUBLAS_VER_MINOR), "GPU matrix products",
                   "the CUDA toolkit's lib64 directory, or the nvidia-cublas wheel's lib,");
  CublasLtLibrary l{};
  auto bind = [&](const char* symbol, auto& fn) { library.bind(symbol, fn); };
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
