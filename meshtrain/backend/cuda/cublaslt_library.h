#pragma once
// cuBLASLt, loaded the first time a GEMM runs on a GPU (dlopen) rather than linked: a linked
// libcublasLt is mapped and statically initialized at every start, about 200 MB resident in
// every process (its relocated data and zeroed tables) — a CPU run's and each MPI rank's
// included, where it is never called (issue 50: a process's memory is its state plus a small
// constant).
#include <cublasLt.h>

namespace mt::cuda {

// The entry points the GEMMs use.
struct CublasLtLibrary {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
};

// Loads libcublasLt.so.<major of the headers built against> once; throws mt::Error naming the
// library and the loader's reason when it cannot be found or lacks an entry point.
const CublasLtLibrary& cublaslt();

}  // namespace mt::cuda
