#pragma once
// Optimizers as composable gradient transforms (optax-style). A transform's state is a flat
// Params (e.g. "mu.<param path>", "count"), so it checkpoints like parameters and each slot
// takes its parameter's sharding (zeros_like keeps the layout).
#include <functional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/autodiff/params.h"
#include "meshtrain/optim/schedule.h"

namespace mt::optim {

struct Transform {
  // State for `params` (slots laid out like their parameters).
  std::function<Params(const Params& params)> init;
  // Turns incoming updates (gradients, or the previous transform's output) into outgoing
  // updates, advancing `state`. `params` are the current parameters. The updates come by
  // value: a caller that moves them in (the Trainer, chain) lets a transform rewrite them in
  // place (clip_by_global_norm scales the gradients' own buffers).
  std::function<Params(Params updates, Params& state, const Params& params)> update;
  // Parameters this transform never updates (optim::freeze inside a partition): they get no
  // optimizer state, the Trainer computes no gradients for them and `update` receives none.
  // Null: every parameter is trainable.
  std::function<bool(const std::string& path)> frozen{};
  // The host half of `update` alone, for an update captured once and replayed (the Trainer's
  // CUDA graph, core/device.h CapturedWork): advances the state's host counters and writes the
  // per-step values its launches read from device memory (Adam's step size, bias correction
  // and decay). An update recorded while capturing (capturing_device_work()) expects it to
  // have run just before and does not repeat it. Null: the transform's launches carry
  // per-step values (sgd's rate), or it branches on the host (multi_steps), so it cannot be
  // captured.
  std::function<void(Params& state)> host_step{};
};
// Whether `t` can be captured (it has a host_step).
bool capturable(const Transform& t);

// True when `t` freezes `path`.
bool is_frozen(const Transform& t, const std::string& path);
// The parameters `t` trains and the ones it freezes, each in params' order.
std::pair<Params, Params> split_frozen(const Transform& t, const Params& params);

// Which parameters get weight decay. The default decays matrices and embeddings and spares
// biases and norm scales (every parameter of rank < 2).
using DecayMask = std::function<bool(const std::string& path, const Array& param)>;
DecayMask default_decay_mask();
// Decays exactly the paths matching `pattern` (std::regex, whole path).
DecayMask decay_mask_regex(const std::string& pattern);

// torch.optim.SGD semantics (momentum buffer b = μ b + g, nesterov g + μ b, L2 weight decay
// added to the gradient).
Transform sgd(Schedule lr, double momentum = 0.0, bool nesterov = false, double weight_decay = 0.0);
// torch.optim.Adam / AdamW semantics (bias-corrected; AdamW decays p by lr·wd first).
Transform adam(Schedule lr, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8);
Transform adamw(Schedule lr, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8, double weight_decay = 0.01,
                DecayMask mask = default_decay_mask());
// Scales all updates by max_norm / (‖updates‖₂ + 1e-6) when that is below one
// (torch.nn.utils.clip_grad_norm_).
Transform clip_by_global_norm(double max_norm);
// Passes the updates through unchanged and keeps no state (optax.identity): a slot in a chain
// that is sometimes empty (no clipping) without moving the other parts' state paths.
Transform identity();
// Applies the transforms in order; state entries are prefixed "<index>.".
Transform chain(std::vector<Transform> transforms);
// Gradient accumulation: averages k incoming updates and runs `inner` on every k-th call;
// the calls in between return zero updates.
Transform multi_steps(Transform inner, int every_k);

// params + updates. Pass the parameters by std::move when nothing else holds them: their
// buffers are then updated in place instead of doubling the parameters' memory.
Params apply_updates(Params params, const Params& updates);
// The global L2 norm of a tree (a replicated scalar, also for sharded trees).
Array global_norm(const Params& tree);
// Every floating array of `tree` multiplied by `coef`, an f32 scalar (on the CPU or a GPU: a
// device value is never read to the host): plain arrays in one multi-tensor pass per device
// and dtype, in their own buffers when the caller moved them in; distributed ones per tensor,
// in f32 math (a small coefficient would round in bf16 and flush in f16). Gradient clipping
// and loss scaling's unscale.
void scale_in_place(Params& tree, const Array& coef);

// For composite transforms (chain, partition, multi_steps): the entries of `state` under
// `prefix.`, moved out with the prefix removed (their places keep their order and hold
// undefined arrays until put_back_subtree refills them). The inner transform then holds the
// only handles to its state, so its kernels may update it in place (Adam's moments).
Params take_subtree(Params& state, const std::string& prefix);
void put_back_subtree(Params& state, const std::string& prefix, const Params& inner);

}  // namespace mt::optim
