#pragma once
// What rank 0 alone computes (sampled completions, reward scores) handed to every rank, with
// its failure instead when it had one: every rank then holds rank 0's result or throws its
// error — never one rank throwing while the others wait in a collective.
#include <cstdint>
#include <string>
#include <vector>

namespace mt::posttrain {

// On rank 0 `words` (or, when `failure` is set, the failure) goes out; on the others they are
// replaced by rank 0's. A no-op in a one-process world.
void share_from_rank0(std::vector<int64_t>& words, std::string& failure);

}  // namespace mt::posttrain
