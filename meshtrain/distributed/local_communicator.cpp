#include "meshtrain/distributed/local_communicator.h"

#include <cstring>

namespace mt::dist {

namespace {
// With one rank every collective is the identity on the data; only distinct buffers need a copy.
void copy_elements(const void* send, void* recv, int64_t count, DType dtype) {  // (count,) -> (count,)
  if (count > 0 && send != recv) std::memmove(recv, send, size_t(count) * dtype_size(dtype));
}
}  // namespace

CommHandle LocalCommunicator::all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) {
  check_and_count(CollectiveKind::all_reduce, data, data, count, dtype);
  return CommHandle::completed();
}

CommHandle LocalCommunicator::all_gather_async(const void* send, void* recv, int64_t count, DType dtype) {
  check_and_count(CollectiveKind::all_gather, send, recv, count, dtype);
  copy_elements(send, recv, count, dtype);
  return CommHandle::completed();
}

CommHandle LocalCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype,
                                                   ReduceOp op) {
  check_and_count(CollectiveKind::reduce_scatter, send, recv, count, dtype);
  copy_elements(send, recv, count, dtype);
  return CommHandle::completed();
}

CommHandle LocalCommunicator::all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) {
  check_and_count(CollectiveKind::all_to_all, send, recv, count, dtype);
  copy_elements(send, recv, count, dtype);
  return CommHandle::completed();
}

CommHandle LocalCommunicator::broadcast_async(void* data, int64_t count, DType dtype, int root) {
  check_and_count(CollectiveKind::broadcast, data, data, count, dtype, root);
  return CommHandle::completed();
}

void LocalCommunicator::barrier() { check_and_count(CollectiveKind::barrier, nullptr, nullptr, 0, DType::f32); }

std::shared_ptr<Communicator> LocalCommunicator::split(int color, int key, const std::string& name) {
  return std::make_shared<LocalCommunicator>(name);
}

}  // namespace mt::dist
