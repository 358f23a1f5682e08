// cuBLASLt is loaded by dlopen at the first GPU GEMM (backend/cuda/cublaslt_library.h), so a
// missing library or entry point would first show on a GPU machine. Loading needs no GPU: this
// test loads it where the CUDA backend is built and checks every entry point the GEMMs call.
#include <gtest/gtest.h>

#if MT_WITH_CUDA
#include "meshtrain/backend/cuda/cublaslt_library.h"
#endif

namespace mt::testing {
namespace {

TEST(CublasLtLibrary, LoadsWithEveryEntryPointTheGemmsCall) {
#if MT_WITH_CUDA
  const cuda::CublasLtLibrary& l = cuda::cublaslt();
  const void* entries[] = {reinterpret_cast<const void*>(l.Create),
                           reinterpret_cast<const void*>(l.Matmul),
                           reinterpret_cast<const void*>(l.MatmulAlgoGetHeuristic),
                           reinterpret_cast<const void*>(l.MatmulDescCreate),
                           reinterpret_cast<const void*>(l.MatmulDescDestroy),
                           reinterpret_cast<const void*>(l.MatmulDescSetAttribute),
                           reinterpret_cast<const void*>(l.MatmulPreferenceCreate),
                           reinterpret_cast<const void*>(l.MatmulPreferenceDestroy),
                           reinterpret_cast<const void*>(l.MatmulPreferenceSetAttribute),
                           reinterpret_cast<const void*>(l.MatrixLayoutCreate),
                           reinterpret_cast<const void*>(l.MatrixLayoutDestroy),
                           reinterpret_cast<const void*>(l.MatrixLayoutSetAttribute)};
  for (const void* e : entries) EXPECT_NE(e, nullptr);
  static_assert(sizeof(entries) / sizeof(entries[0]) == sizeof(cuda::CublasLtLibrary) / sizeof(void*),
                "every entry point of CublasLtLibrary is checked");
  // Loaded once: the same table again.
  EXPECT_EQ(&cuda::cublaslt(), &l);
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

}  // namespace
}  // namespace mt::testing
