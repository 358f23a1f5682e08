// The CUDA backend's stand-in in builds without CUDA (MESHTRAIN_CUDA=OFF, or no nvcc): no GPU
// is ever visible, so Device::parse refuses "cuda" with a clear message and no array can reach
// these kernels; they throw all the same, in case one is called directly.
#include <utility>

#include "meshtrain/backend/attention.h"
#include "meshtrain/backend/elementwise.h"
#include "meshtrain/backend/indexing.h"
#include "meshtrain/backend/loss.h"
#include "meshtrain/backend/matmul.h"
#include "meshtrain/backend/norm.h"
#include "meshtrain/backend/optimizer.h"
#include "meshtrain/backend/paged_attention.h"
#include "meshtrain/backend/random.h"
#include "meshtrain/backend/reduce.h"
#include "meshtrain/backend/rotary.h"
#include "meshtrain/backend/softmax.h"
#include "meshtrain/backend/strided_copy.h"
#include "meshtrain/core/device.h"
#include "meshtrain/core/error.h"

namespace mt {

namespace {
[[noreturn]] void no_cuda() { throw Error("[cuda] meshtrain was built without CUDA (configure with -DMESHTRAIN_CUDA=ON)"); }

class NoCudaRuntime final : public DeviceRuntime {
 public:
  int device_count() const override { return 0; }
  std::string describe(int) const override { return "none"; }
  std::shared_ptr<void> allocate(int, size_t) const override { no_cuda(); }
  void copy_to_host(void*, const void*, size_t) const override { no_cuda(); }
  void copy_from_host(void*, const void*, size_t) const override { no_cuda(); }
  void copy_on_device(void*, const void*, size_t) const override { no_cuda(); }
  void fill_bytes(void*, const void*, size_t, size_t) const override { no_cuda(); }
  void synchronize() const override {}
  DeviceMemoryStats memory_stats(int) const override { no_cuda(); }
  void reset_peak(int) const override { no_cuda(); }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>&) const override { no_cuda(); }
  bool capturing() const override { return false; }
  std::string start_device_trace() const override { return "meshtrain was built without CUDA"; }
  std::vector<DeviceSpan> stop_device_trace() const override { return {}; }
};
}  // namespace

const DeviceRuntime& cuda_runtime() {
  static const NoCudaRuntime runtime;
  return runtime;
}

namespace cuda {
void unary(kernels::UnaryOp, const Array&, Array&) { no_cuda(); }
void binary(kernels::BinaryOp, const Array&, const Array&, Array&) { no_cuda(); }
void where(const Array&, const Array&, const Array&, Array&) { no_cuda(); }
void relu_backward(const Array&, const Array&, Array&) { no_cuda(); }
void gelu_backward(const Array&, const Array&, bool, Array&) { no_cuda(); }
void cast(const Array&, Array&) { no_cuda(); }
void bias_activation(kernels::UnaryOp, const Array&, const Array&, Array&) { no_cuda(); }
void bias_activation_backward(kernels::UnaryOp, const Array&, const Array&, const Array&, Array&, Array*) { no_cuda(); }
void strided_copy(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                  const std::vector<int64_t>&, size_t) { no_cuda(); }
void reduce(kernels::ReduceOp, const Array&, Array&, int64_t, int64_t, int64_t) { no_cuda(); }
void argmax(const Array&, Array&, int64_t, int64_t, int64_t) { no_cuda(); }
void rotary(const Array&, const Array&, const Array&, const kernels::RotaryShape&, Array&) { no_cuda(); }
void softmax_forward(const Array&, Array&, int64_t, int64_t, int64_t, bool) { no_cuda(); }
void causal_softmax_forward(const Array&, Array&, int64_t, int64_t, int64_t, float) { no_cuda(); }
void softmax_backward(const Array&, const Array&, Array&, int64_t, int64_t, float) { no_cuda(); }
void norm_forward(bool, const Array&, const Array&, const Array&, double, Array&, Array&, Array&,
                  const kernels::DropoutBranch*) {
  no_cuda();
}
void norm_backward(bool, const Array&, const Array&, const Array&, const Array&, const Array&, Array&, Array*, Array*,
                   const kernels::DropoutBranch*) {
  no_cuda();
}
bool flash_attention_supported(const Array&, int64_t) { return false; }
bool flash_attention_tensor_cores(const Array&, int64_t) { return false; }
int64_t dropout_keep_bits_words(const Array&, const kernels::FlashAttentionShape&) { return 0; }
uint64_t flash_attention_pipelined_launches() { return 0; }
uint64_t cudnn_attention_forwards() { return 0; }
uint64_t cudnn_attention_backwards() { return 0; }
std::string cudnn_attention_measured_choices() { return ""; }
std::string cudnn_attention_last_refusal() { return ""; }
void set_matmul_tuning(bool) {}
// No GPU GEMMs, so no plans: the capacity is only remembered.
size_t set_matmul_cache_capacity(size_t plans) {
  MT_CHECK(plans >= 1, "[matmul] the plan cache must hold at least one plan");
  static size_t capacity = kernels::matmul_plan_capacity_from_env();
  return std::exchange(capacity, plans);
}
size_t matmul_cache_size() { return 0; }
uint64_t matmul_plans_created() { return 0; }
void flash_attention_forward_tc(const Array&, const Array&, const Array&, const kernels::FlashAttentionShape&, Array&,
                                Array&, const int32_t*) {
  no_cuda();
}
void flash_attention_backward_tc(const Array&, const Array&, const Array&, const Array&, const Array&, const Array&,
                                 const kernels::FlashAttentionShape&, Array&, Array&, Array&, const int32_t*) {
  no_cuda();
}
void flash_attention_forward(const Array&, const Array&, const Array&, const kernels::FlashAttentionShape&, Array&, Array&) {
  no_cuda();
}
void flash_attention_backward(const Array&, const Array&, const Array&, const Array&, const Array&, const Array&,
                              const kernels::FlashAttentionShape&, Array&, Array&, Array&) {
  no_cuda();
}
void paged_kv_write(Array&, const Array&, const std::vector<int64_t>&) { no_cuda(); }
void paged_attention(const Array&, const Array&, const Array&, const kernels::PagedRows&, float, Array&) { no_cuda(); }
void cross_entropy_forward(const Array&, const Array&, int64_t, int64_t, float, Array&, Array&) { no_cuda(); }
void cross_entropy_backward(const Array&, const Array&, int64_t, const Array&, const Array&, int64_t, float, Array&) {
  no_cuda();
}
void cross_entropy_total(const Array&, const Array&, bool, Array&) { no_cuda(); }
void index_verdict(const Array&, int64_t, int64_t, Array&, Array*, const char*) { no_cuda(); }
void take(const Array&, const Array&, Array&, int64_t, int64_t, int64_t) { no_cuda(); }
void scatter_add(const Array&, const Array&, Array&, int64_t, int64_t, int64_t) { no_cuda(); }
void take_along_axis(const Array&, const Array&, Array&, int) { no_cuda(); }
void scatter_add_along_axis(const Array&, const Array&, Array&, int) { no_cuda(); }
void top_k(const Array&, Array&, Array&, int64_t, int64_t, int64_t, int64_t) { no_cuda(); }
void one_hot(const Array&, Array&, int64_t) { no_cuda(); }
void dropout(const Array&, Array&, const RngKey&, double, const kernels::StreamBlock&) { no_cuda(); }
void dropout_add(const Array&, const Array&, Array&, const RngKey&, double, const kernels::StreamBlock&) { no_cuda(); }
void cross_entropy_count(const Array&, int64_t, Array&) { no_cuda(); }
void adam_moments(const Array&, const Array&, const Array&, const kernels::AdamHyper&, Array&) { no_cuda(); }
void adam_direction(const Array&, const Array&, const Array*, const kernels::AdamHyper&, const Array&, Array&) {
  no_cuda();
}
void adam_moments_multi(const std::vector<Array>&, const kernels::AdamHyper&, Array&) { no_cuda(); }
void adam_direction_multi(const std::vector<Array>&, const std::vector<uint8_t>&, const kernels::AdamHyper&,
                          const Array&, std::vector<Array>&) {
  no_cuda();
}
void sum_squares_multi(const std::vector<Array>&, Array&) { no_cuda(); }
void scale_multi(const std::vector<Array>&, const Array&, std::vector<Array>&) { no_cuda(); }
void add_multi(const std::vector<Array>&, std::vector<Array>&) { no_cuda(); }
void cast_multi(const std::vector<Array>&, std::vector<Array>&) { no_cuda(); }
void matmul(kernels::MatmulDType, const void*, const void*, void*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
            bool, bool) {
  no_cuda();
}
void matmul_bias(kernels::MatmulDType, const void*, const void*, const void*, void*, int64_t, int64_t, int64_t, bool,
                 bool) {
  no_cuda();
}
}  // namespace cuda

}  // namespace mt
