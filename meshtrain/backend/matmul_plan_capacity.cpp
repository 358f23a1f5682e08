#include <cstdio>
#include <cstdlib>

#include "meshtrain/backend/matmul.h"

namespace mt::kernels {

size_t matmul_plan_capacity_from_env() {
  constexpr size_t kDefault = 1024;
  const char* v = std::getenv("MT_MATMUL_PLAN_CACHE");
  if (!v) return kDefault;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*v >= '0' && *v <= '9' && *end == '\0' && n >= 1) return size_t(n);
  std::fprintf(stderr, "meshtrain: [matmul] MT_MATMUL_PLAN_CACHE must be a number of plans >= 1, got '%s'; using %zu\n",
               v, kDefault);
  return kDefault;
}

}  // namespace mt::kernels
