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

}  // namespace tessera
