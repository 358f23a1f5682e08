#include "meshtrain/backend/cuda/cudnn_graph.h"

#include "meshtrain/core/error.h"

namespace mt::cuda::cudnn_graph {

namespace {

const CudnnLibrary& lib() { return cudnn(); }

void check_status(cudnnStatus_t status, const std::string& what) {
  if (status != CUDNN_STATUS_SUCCESS) throw Error(detail::concat("[cudnn] ", what, ": ", status_text(status)));
}

}  // namespace

std::string status_text(cudnnStatus_t status) {
  std::string text = lib().GetErrorString(status);
  char message[1024] = {};
  lib().GetLastErrorString(message, sizeof(message));
  if (message[0] != '\0') text += std::string(" (") + message + ")";
  return text;
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  check_status(lib().BackendCreateDescriptor(type, &d_), "create descriptor of type " + std::to_string(int(type)));
}

Descriptor::~Descriptor() {
  if (d_) lib().BackendDestroyDescriptor(d_);
}

void Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                     const void* values, const std::string& what) {
  check_status(lib().BackendSetAttribute(d_, name, type, count, values),
               what + ": attribute " + std::to_string(int(name)));
}

void Descriptor::finalize(const std::string& what) { check_status(lib().BackendFinalize(d_), what + ": finalize"); }

const Descriptor& Graph::tensor(const TensorSpec& spec, const std::string& name) {
  Descriptor& t = owned_.emplace_back(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::string what = "tensor " + name;
  const int64_t alignment = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &spec.dtype, what);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, spec.dims.data(), what);
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, spec.strides.data(), what);
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &spec.uid, what);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
  if (spec.is_virtual) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
  }
  if (spec.by_value) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, what);
  }
  t.finalize(what);
  return t;
}

void Graph::operation(cudnnBackendDescriptorType_t type, const std::vector<Operand>& operands,
                      const std::string& what) {
  Descriptor& op = owned_.emplace_back(type);
  for (const Operand& o : operands) {
    if (!o.descriptor) continue;
    cudnnBackendDescriptor_t d = o.descriptor->get();
    op.set(o.attribute, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d, what);
  }
  op.finalize(what);
  ops_.push_back(op.get());
}

const Descriptor& Graph::described(cudnnBackendDescriptorType_t type, const std::vector<Setting>& settings,
                                   const std::string& what) {
  Descriptor& desc = owned_.emplace_back(type);
  for (const Setting& s : settings) desc.set(s.attribute, s.type, 1, s.value, what);
  desc.finalize(what);
  return desc;
}

void Graph::matmul(const Descriptor& a, const Descriptor& b, const Descriptor& c, const std::string& name) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Descriptor& desc = described(CUDNN_BACKEND_MATMUL_DESCRIPTOR,
                                     {{CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32}}, "matmul " + name);
  operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
            {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, &a},
             {CUDNN_ATTR_OPERATION_MATMUL_BDESC, &b},
             {CUDNN_ATTR_OPERATION_MATMUL_CDESC, &c},
             {CUDNN_ATTR_OPERATION_MATMUL_DESC, &desc}},
            "matmul operation " + name);
}

void Graph::pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t precision, const Descriptor& x, const Descriptor& y,
                      const Descriptor* b, const Descriptor* t, int64_t axis, const std::string& name) {
  std::vector<Setting> settings = {{CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode},
                                   {CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision}};
  if (axis >= 0) settings.push_back({CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis});
  const Descriptor& desc = described(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, settings, "pointwise " + name);
  // The condition of BINARY_SELECT after y, as the frontend orders them.
  operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
            {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &desc},
             {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &x},
             {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
             {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &y},
             {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t}},
            "pointwise operation " + name);
}

void Graph::reduction(cudnnReduceTensorOp_t reduce, const Descriptor& x, const Descriptor& y, const std::string& name) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Descriptor& desc = described(CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
                                     {{CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &reduce},
                                      {CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32}},
                                     "reduction " + name);
  operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
            {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &x},
             {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &y},
             {CUDNN_ATTR_OPERATION_REDUCTION_DESC, &desc}},
            "reduction operation " + name);
}

void Graph::rng_bernoulli(double probability, const Descriptor& seed, const Descriptor& offset, const Descriptor& y,
                          const std::string& name) {
  const cudnnRngDistribution_t bernoulli = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
  const Descriptor& desc = described(CUDNN_BACKEND_RNG_DESCRIPTOR,
                                     {{CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, &bernoulli},
                                      {CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, &probability}},
                                     "rng " + name);
  operation(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR,
            {{CUDNN_ATTR_OPERATION_RNG_YDESC, &y},
             {CUDNN_ATTR_OPERATION_RNG_DESC, &desc},
             {CUDNN_ATTR_OPERATION_RNG_SEED, &seed},
             {CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, &offset}},
            "rng operation " + name);
}

void Graph::reshape(const Descriptor& x, const Descriptor& y, const std::string& name) {
  operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
            {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &x}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &y}},
            "reshape operation " + name);
}

Plan make_plan(cudnnHandle_t handle, const Graph& graph, const std::string& what) {
  Plan p;
  p.keep.reserve(4);  // the graph, the heuristics, the chosen config and the plan: no reallocation
  // The graph: its finalize refuses a malformed graph (an error in the code that built it) and
  // may refuse one no engine takes; either is kept in `refusal`, as engines refusing it below
  // are (the route then runs its kernels and says why; the GPU tests check for no refusal).
  Descriptor& op_graph = p.keep.emplace_back(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  op_graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, what + " graph");
  op_graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(graph.operations().size()),
               graph.operations().data(), what + " graph");
  const cudnnStatus_t graph_status = lib().BackendFinalize(op_graph.get());
  if (graph_status != CUDNN_STATUS_SUCCESS) {
    p.refusal = "the operation graph: " + status_text(graph_status);
    return p;
  }
  Descriptor& heuristics = p.keep.emplace_back(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendDescriptor_t g = op_graph.get();
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g, what + " heuristics");
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, what + " heuristics");
  const cudnnStatus_t heur_status = lib().BackendFinalize(heuristics.get());
  if (heur_status != CUDNN_STATUS_SUCCESS) {
    p.refusal = "the engine heuristics: " + status_text(heur_status);
    return p;
  }
  int64_t count = 0;
  check_status(lib().BackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         0, &count, nullptr),
               what + " heuristics: count");
  if (count <= 0) {
    p.refusal = "no engine takes the graph (" + status_text(CUDNN_STATUS_NOT_SUPPORTED) + ")";
    return p;
  }
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t returned = 0;
  check_status(lib().BackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                         count, &returned, raw.data()),
               what + " heuristics: results");
  std::string refusals;
  for (int64_t i = 0; i < returned; ++i) {
    Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t config = raw[size_t(i)];
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, what + " plan");
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config, what + " plan");
    const cudnnStatus_t status = lib().BackendFinalize(plan.get());
    if (status != CUDNN_STATUS_SUCCESS) {
      refusals += (refusals.empty() ? "" : "; ") + std::string("engine config ") + std::to_string(i) + ": " +
                  status_text(status);
      continue;
    }
    check_status(lib().BackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           nullptr, &p.workspace_bytes),
                 what + " plan: workspace size");
    p.plan = plan.get();
    p.keep.push_back(std::move(configs[size_t(i)]));
    p.keep.push_back(std::move(plan));
    return p;
  }
  p.refusal = "none of the " + std::to_string(returned) + " engine configs finalized: " + refusals;
  return p;
}

void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, const std::string& what) {
  MT_CHECK(plan.plan != nullptr, "[cudnn] ", what, ": no plan (", plan.refusal, ")");
  MT_CHECK(uids.size() == pointers.size(), "[cudnn] ", what, ": ", uids.size(), " tensor ids and ", pointers.size(),
           " pointers");
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  const std::string where = what + " variant pack";  // once: this runs at every attention call
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data(), where);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data(), where);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, where);
  pack.finalize(where);
  check_status(lib().BackendExecute(handle, plan.plan, pack.get()), what + ": execute");
}

}  // namespace mt::cuda::cudnn_graph
