// Activation checkpointing: trade compute for memory by recomputing a segment in backward.
#pragma once

#include <functional>
#include <vector>

#include "autograd/node.h"
#include "core/philox.h"

namespace tessera {

using SegmentFn = std::function<TensorList(const TensorList& inputs)>;

// How checkpoint() keeps a segment's inputs until backward and what it does around each
// segment: DeepSpeed's activation_checkpointing options (parallel/engine/
// checkpoint_policy.h builds one from them). Every member is optional.
struct CheckpointPolicy {
  // Keeps an input for the recomputation and returns what gives it back (a piece of it
  // all-gathered again, a host copy moved back); unset, the input itself is kept.
  std::function<std::function<Tensor()>(const Tensor&)> keep;
  // Runs after each segment's forward and before and after its recomputation.
  std::function<void()> at_boundary;
  // Receives the seconds of each segment's forward run (backward false) and of its
  // recomputation with its backward (backward true).
  std::function<void(bool backward, double seconds)> timed;
};

// Runs `fn` without keeping its intermediate activations. In backward, the segment runs
// again with recording on, and gradients flow through the recomputed graph to `inputs`
// and to any parameters `fn` uses. The generators in `rngs` are rewound to their state
// at the first run so that the recomputation draws the same dropout masks; `fn` must be
// otherwise deterministic. `policy` says how the inputs are kept until backward and what
// runs around the segment.
TensorList checkpoint(const SegmentFn& fn, const TensorList& inputs,
                      const std::vector<Generator*>& rngs = {},
                      const CheckpointPolicy& policy = {});

// Runs layers 0 .. n-1 in order (x = layer(i, x)). With interval > 0 and grad mode on,
// every `interval` consecutive layers form one checkpoint (PyTorch's checkpoint_sequential),
// rewinding `rngs` for the recomputation and keeping inputs by `policy` as checkpoint()
// does.
Tensor checkpoint_sequential(Tensor x, size_t n, int64_t interval,
                             const std::function<Tensor(size_t, const Tensor&)>& layer,
                             const std::vector<Generator*>& rngs = {},
                             const CheckpointPolicy& policy = {});

}  // namespace tessera
