#include "meshtrain/data/data_loader.h"

namespace mt::data {

std::string describe_batch_error(const char* stage, const SampledBatch& info, const std::string& what) {
  std::string indices;
  for (size_t k = 0; k < info.indices.size() && k < 8; ++k) {
    indices += (k ? ", " : "") + std::to_string(info.indices[k]);
  }
  if (info.indices.size() > 8) indices += ", ...";
  return ::mt::detail::concat("[DataLoader] ", stage, " failed on batch ", info.batch, " of epoch ", info.epoch,
                              " (examples ", indices, "): ", what);
}

}  // namespace mt::data
