// Activation checkpointing: trade compute for memory by recomputing a segment in backward.
#pragma once

#include <functional>
#include <vector>

#include "autograd/node.h"
#include "core/philox.h"

namespace tessera {

using SegmentFn = std::function<TensorList(const TensorList& inputs)>;

// Runs `fn` without keeping its intermediate activations. In backward, the segment runs
// again with recording on, and gradients flow through the recomputed graph to `inputs`
// and to any parameters `fn` uses. The generators in `rngs` are rewound to their state
// at the first run so that the recomputation draws the same dropout masks; `fn` must be
// otherwise deterministic.
TensorList checkpoint(const SegmentFn& fn, const TensorList& inputs,
                      const std::vector<Generator*>& rngs = {});

// Runs layers 0 .. n-1 in order (x = layer(i, x)). With interval > 0 and grad mode on,
// every `interval` consecutive layers form one checkpoint (PyTorch's checkpoint_sequential),
// rewinding `rngs` for the recomputation as checkpoint() does.
Tensor checkpoint_sequential(Tensor x, size_t n, int64_t interval,
                             const std::function<Tensor(size_t, const Tensor&)>& layer,
                             const std::vector<Generator*>& rngs = {});

}  // namespace tessera
