#pragma once
// cuDNN's graph (backend) API in small pieces: owned descriptors, tensors, the three operation
// kinds the attention graphs are made of (matmul, pointwise, reduction), and an execution plan
// from the engine heuristics. The C++ frontend that usually wraps this API is not on these
// machines; cudnn_attention.cpp builds its graphs from these pieces.
#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "meshtrain/backend/cuda/cudnn_library.h"

namespace mt::cuda::cudnn_graph {

// A backend descriptor destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

  // Sets one attribute; an error names `what` and the attribute's number.
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values,
           const std::string& what);
  // Finalizes; an error names `what` with cuDNN's status and last message.
  void finalize(const std::string& what);

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// cuDNN's status and its last error message, for errors that name what failed.
std::string status_text(cudnnStatus_t status);

// A 4-d tensor of the graph. Virtual tensors live only inside the fused kernel; by-value
// tensors are scalars passed from host memory at execution.
struct TensorSpec {
  int64_t uid = 0;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::array<int64_t, 4> dims{}, strides{};
  bool is_virtual = false;
  bool by_value = false;
};

// The descriptors of one operation graph, kept alive together (an operation refers to its
// tensors' descriptors until the plan is made), and the operations in the order built.
class Graph {
 public:
  // A finalized tensor; its descriptor lives as long as the graph.
  const Descriptor& tensor(const TensorSpec& spec, const std::string& name);
  // c = a · b over the last two dims (batch dims broadcast where one side has 1 or divides the
  // other, as grouped-query heads do), accumulated in f32.
  void matmul(const Descriptor& a, const Descriptor& b, const Descriptor& c, const std::string& name);
  // y = mode(x[, b][, t]) computed in `precision`; `axis` for GEN_INDEX (the dim whose index is
  // written), -1 otherwise. BINARY_SELECT writes t ? x : b.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t precision, const Descriptor& x, const Descriptor& y,
                 const Descriptor* b, const Descriptor* t, int64_t axis, const std::string& name);
  // y = reduce(x) over the dims where y has 1, accumulated in f32.
  void reduction(cudnnReduceTensorOp_t op, const Descriptor& x, const Descriptor& y, const std::string& name);
  // y = Bernoulli(probability) draws (1 or 0) from cuDNN's Philox generator at `seed` and
  // `offset` (device tensors of one int64 each).
  void rng_bernoulli(double probability, const Descriptor& seed, const Descriptor& offset, const Descriptor& y,
                     const std::string& name);
  // y = x seen with y's dims and strides (a transpose where two strides swap places).
  void reshape(const Descriptor& x, const Descriptor& y, const std::string& name);

  const std::vector<cudnnBackendDescriptor_t>& operations() const { return ops_; }

 private:
  // An operation's descriptor-valued attribute (skipped when null: an optional operand).
  struct Operand {
    cudnnBackendAttributeName_t attribute;
    const Descriptor* descriptor;
  };
  // An operation of `type` with these operands, finalized and appended to the graph.
  void operation(cudnnBackendDescriptorType_t type, const std::vector<Operand>& operands, const std::string& what);
  // One value-typed attribute of a descriptor (one element).
  struct Setting {
    cudnnBackendAttributeName_t attribute;
    cudnnBackendAttributeType_t type;
    const void* value;
  };
  // A descriptor of `type` (an operation's matmul, pointwise, reduction or RNG settings) with
  // these settings, finalized and owned by the graph.
  const Descriptor& described(cudnnBackendDescriptorType_t type, const std::vector<Setting>& settings,
                              const std::string& what);

  std::deque<Descriptor> owned_;  // stable addresses
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// An execution plan for a graph on `handle`: the first of the heuristics' engine configs that
// finalizes. `refusal` says why none did (the plan then stays empty).
struct Plan {
  std::vector<Descriptor> keep;  // the operation graph, its engine config and the plan
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
  std::string refusal;
};
Plan make_plan(cudnnHandle_t handle, const Graph& graph, const std::string& what);

// Runs `plan` on the handle's stream with the tensors `uids` at `pointers` (by-value tensors:
// host addresses of their values) and `workspace` (plan.workspace_bytes of device memory).
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, const std::string& what);

}  // namespace mt::cuda::cudnn_graph
