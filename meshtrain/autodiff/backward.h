#pragma once
// The reverse pass over the tape (node.h). It sits above ops: cotangents are accumulated
// with add(), and a distributed cotangent reaching a plain node is gathered through the
// distributed executor.
#include <functional>
#include <vector>

#include "meshtrain/autodiff/node.h"

namespace mt::autodiff {

// Cotangents of `output` with respect to each target (leaves made by make_leaf).
// With create_graph the backward pass is itself recorded (for higher-order gradients).
// on_final(i, g), when given, is called as soon as target i's cotangent is complete (all
// its consumers processed), so its reduction can start while the pass goes on; every target
// is reported exactly once (g undefined when nothing reached it).
using FinalFn = std::function<void(size_t, const Array&)>;
std::vector<Array> backward(const Array& output, const Array& cotangent, const std::vector<Array>& targets,
                            bool create_graph, const FinalFn& on_final = {});

}  // namespace mt::autodiff
