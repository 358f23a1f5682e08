#include "meshtrain/posttrain/rank0_share.h"

#include "meshtrain/distributed/communicator.h"

namespace mt::posttrain {

void share_from_rank0(std::vector<int64_t>& words, std::string& failure) {
  dist::Communicator& world = dist::world();
  if (world.size() == 1) return;
  // [0, words...] or [1, the failure's bytes...].
  std::vector<int64_t> flat;
  if (world.rank() == 0) {
    flat.push_back(failure.empty() ? 0 : 1);
    if (failure.empty()) flat.insert(flat.end(), words.begin(), words.end());
    else
      for (char ch : failure) flat.push_back(int64_t(static_cast<unsigned char>(ch)));
  }
  int64_t size = int64_t(flat.size());
  world.broadcast(&size, 1, DType::i64, 0);
  flat.resize(size_t(size));
  world.broadcast(flat.data(), size, DType::i64, 0);
  if (world.rank() == 0) return;
  words.clear();
  failure.clear();
  if (flat[0] == 0) words.assign(flat.begin() + 1, flat.end());
  else
    for (size_t i = 1; i < flat.size(); ++i) failure += char(flat[i]);
}

}  // namespace mt::posttrain
