#include "meshtrain/backend/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <string>

#include "meshtrain/core/error.h"

namespace mt::cuda {

namespace {

const std::string& library_name() {
  static const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  return name;
}

template <class Fn>
void bind(void* library, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, symbol));
  MT_CHECK(fn != nullptr, "[cuda] ", library_name(), " has no ", symbol, " (a cuBLASLt older than the headers, ",
           CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, ", meshtrain was built with?)");
}

CublasLtLibrary load() {
  void* library = dlopen(library_name().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = dlerror();
    throw Error(detail::concat("[cuda] cannot load ", library_name(), " for GPU matrix products: ",
                               why ? why : "not found",
                               " (the CUDA toolkit's lib64 directory, or the nvidia-cublas wheel's lib, must be on "
                               "LD_LIBRARY_PATH)"));
  }
  CublasLtLibrary l{};
  bind(library, "cublasLtCreate", l.Create);
  bind(library, "cublasLtMatmul", l.Matmul);
  bind(library, "cublasLtMatmulAlgoGetHeuristic", l.MatmulAlgoGetHeuristic);
  bind(library, "cublasLtMatmulDescCreate", l.MatmulDescCreate);
  bind(library, "cublasLtMatmulDescDestroy", l.MatmulDescDestroy);
  bind(library, "cublasLtMatmulDescSetAttribute", l.MatmulDescSetAttribute);
  bind(library, "cublasLtMatmulPreferenceCreate", l.MatmulPreferenceCreate);
  bind(library, "cublasLtMatmulPreferenceDestroy", l.MatmulPreferenceDestroy);
  bind(library, "cublasLtMatmulPreferenceSetAttribute", l.MatmulPreferenceSetAttribute);
  bind(library, "cublasLtMatrixLayoutCreate", l.MatrixLayoutCreate);
  bind(library, "cublasLtMatrixLayoutDestroy", l.MatrixLayoutDestroy);
  bind(library, "cublasLtMatrixLayoutSetAttribute", l.MatrixLayoutSetAttribute);
  return l;  // the library stays loaded for the process's life
}

}  // namespace

const CublasLtLibrary& cublaslt() {
  static const CublasLtLibrary library = load();  // a failed load throws, and the next call tries again
  return library;
}

}  // namespace mt::cuda
