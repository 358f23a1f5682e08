#pragma once
// Libraries the CUDA backend loads on first use (dlopen) instead of linking them: cuBLASLt
// (cublaslt_library.h) and cuDNN (cudnn_library.h). Linked, each is mapped and initialized in
// every process, a CPU run's and each MPI rank's included, where it is never called.
#include <dlfcn.h>

#include <string>

#include "meshtrain/core/error.h"

namespace mt::cuda {

// A library opened for its entry points, named for errors.
struct DynamicLibrary {
  void* handle = nullptr;
  std::string name;     // e.g. libcudnn.so.9
  std::string headers;  // the version of the headers meshtrain was built with, e.g. "9.19"

  // fn = `symbol`, or an mt::Error naming both: a library older than the headers.
  template <class Fn>
  void bind(const char* symbol, Fn& fn) const {
    fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
    MT_CHECK(fn != nullptr, "[cuda] ", name, " has no ", symbol, " (older than the headers, ", headers,
             ", meshtrain was built with?)");
  }
};

// `name` opened (it stays loaded for the process's life), or an mt::Error naming it, what it
// is loaded for and the loader's reason.
inline DynamicLibrary open_library(std::string name, std::string headers, const char* purpose,
                                   const char* where_to_find) {
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Error(detail::concat("[cuda] cannot load ", name, " for ", purpose, ": ", why ? why : "not found", " (",
                               where_to_find, " must be on LD_LIBRARY_PATH)"));
  }
  return {handle, std::move(name), std::move(headers)};
}

}  // namespace mt::cuda
