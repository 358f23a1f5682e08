#pragma once
// GCC 12 leaves a row loop that converts halves both ways (load f16, store f16) scalar when it
// sits inside an outer loop over rows: it hoists the inner loop's guard out of the nest and
// then fails to vectorize the conversions (bf16's and f32's loops are not affected). Called
// through this function, not inlined, the row is a loop of its own and vectorizes. The call
// per row costs nothing next to a row's work.
namespace mt::cpu {

template <class Row>
[[gnu::noinline]] void as_own_loop(const Row& row) {
  row();
}

}  // namespace mt::cpu
