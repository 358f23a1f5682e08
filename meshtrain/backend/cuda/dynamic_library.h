#pragma once
// Libraries the CUDA backend loads on first use (dlopen) instead of linking them: cuBLASLt
// (cublaslt_library.h) and cuDNN (cudnn_library.h). Linked, each is mapped and initialized in
// every process, a CPU run's and each MPI rank's included, where it is never called.
#include <dlfcn.h>

#include <string>

#include "meshtrain/core/error.h"

namespace mt::cuda {

// `name` opened, or an mt::Error naming it, what it is loaded for and the loader's reason.
inline void* open_library(const std::string& name, const char* purpose, const char* where_to_find) {
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = dlerror();
    throw Error(detail::concat("[cuda] cannot load ", name, " for ", purpose, ": ", why ? why : "not found", " (",
                               where_to_find, " must be on LD_LIBRARY_PATH)"));
  }
  return library;  // stays loaded for the process's life
}

// fn = `symbol` of `library`, or an mt::Error naming both: a library older than the headers
// meshtrain was built with (`headers`, e.g. "12.9").
template <class Fn>
void bind_symbol(void* library, const std::string& name, const char* symbol, const std::string& headers, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, symbol));
  MT_CHECK(fn != nullptr, "[cuda] ", name, " has no ", symbol, " (older than the headers, ", headers,
           ", meshtrain was built with?)");
}

}  // namespace mt::cuda
