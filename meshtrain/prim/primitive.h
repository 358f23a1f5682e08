#pragma once
// A primitive is the unit of the engine (like MLX's Primitive or a JAX primitive with its
// partitioning rule): one object holding the op's attributes and everything the system needs
// to know about it — the shape/dtype check, the CPU kernel, the VJP (written with ops, so it
// is differentiable again), the sharding rule and the FLOP/byte counts. The dispatcher
// (dispatch.h) is the only code that calls these; ops/ are thin builders that make a
// primitive and apply it.
#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/core/array.h"
#include "meshtrain/layout/rules.h"

namespace mt::prim {

struct OutputInfo {
  Shape shape;
  DType dtype = DType::f32;
};

// Work one application does (for profiles: MFU, roofline, op tables).
struct Cost {
  double flops = 0;
  double bytes = 0;  // read + written
};

// Where this rank's blocks sit in the global arrays, for primitives whose local computation
// depends on it (a reshape's local target shape, an embedding's vocabulary offset, dropout's
// mask positions).
struct LocalContext {
  layout::MeshShape mesh;
  std::vector<Shape> input_global;                   // per input (empty shape when undefined)
  std::vector<layout::PartitionSpec> input_specs;    // the layouts the rule brought them to
  std::vector<std::vector<int64_t>> input_offsets;   // start of this rank's block, per dim
  Shape output_global, output_local;
  layout::PartitionSpec output_spec;
  std::vector<int64_t> output_offsets;
};

class Primitive;
using PrimitivePtr = std::shared_ptr<const Primitive>;

// What a primitive's time counts as in the profiler's step breakdown.
enum class OpKind { gemm, attention, other };
inline const char* op_kind_name(OpKind kind) {
  return kind == OpKind::gemm ? "gemm" : kind == OpKind::attention ? "attention" : "other";
}

// What a VJP receives: the values its primitive asked to keep, and the shapes, dtypes and
// tracing of every input.
struct Saved {
  PrimitivePtr primitive;
  std::vector<Array> inputs;  // undefined where the primitive did not keep that input
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  std::vector<bool> traced;  // the inputs that want a cotangent
  Array output;              // detached; defined when the primitive keeps its output
  std::vector<Array> aux;    // extra values the kernel saved (e.g. normalization statistics)

  bool wants(size_t i) const { return traced[i]; }
  // The output inside the VJP: the saved value in a first-order pass, recomputed with history
  // when the backward pass is itself recorded (higher-order gradients).
  Array output_for_vjp() const;
};

class Primitive {
 public:
  virtual ~Primitive() = default;
  virtual const char* name() const = 0;

  // Validates the inputs (global shapes and dtypes) and describes the output. Errors are
  // mt::Error naming the primitive and the offending arrays.
  virtual OutputInfo infer(const std::vector<Array>& inputs) const = 0;
  // The kernel, on plain (local) arrays: returns the output described by `out` (it may be a
  // view of an input, never the input handle itself). `aux` receives values the VJP needs.
  virtual Array run(const std::vector<Array>& inputs, const OutputInfo& out, std::vector<Array>& aux) const = 0;

  // ---- autodiff ----
  // Whether the output carries a gradient (default: a floating output).
  virtual bool differentiable(const std::vector<Array>& inputs, const OutputInfo& out) const;
  // Bit i set: the VJP needs input i's value (not only its shape). Keeping less frees
  // activations earlier.
  virtual uint32_t keeps_inputs() const { return ~0u; }
  virtual bool keeps_output() const { return false; }
  // Cotangents of the inputs (undefined = none) from the output's cotangent, written with ops.
  virtual std::vector<Array> vjp(const Saved& saved, const Array& cotangent) const;

  // ---- distribution ----
  // The layouts to compute in (default: everything replicated, always correct).
  virtual layout::RuleResult sharding(const std::vector<layout::ArgInfo>& in, const layout::MeshShape& mesh) const;
  // The primitive each rank applies to its blocks (default: `self`).
  virtual PrimitivePtr localize(const LocalContext& ctx, const PrimitivePtr& self) const { return self; }

  // ---- cost ----
  // Default: one flop per output element, every input and the output moved once.
  virtual Cost cost(const std::vector<Array>& inputs, const OutputInfo& out) const;
  // Whether this primitive's FLOPs are model FLOPs (GEMMs: the numerator of MFU).
  virtual bool counts_model_flops() const { return false; }
  // The step breakdown's category of its time (the profiler reads it from the op's span).
  virtual OpKind kind() const { return OpKind::other; }
};

// A shared instance of a primitive type without attributes.
template <class P>
const PrimitivePtr& instance() {
  static const PrimitivePtr p = std::make_shared<P>();
  return p;
}

}  // namespace mt::prim
