// A gradient handed on while a collective still completes it, and the wait for it placed
// where the gradient is used.
//
// Note [Deferred gradient waits]
// A column-parallel layer's input gradient is its rank's part of a sum over the model
// group; the layer starts that sum as soon as the gradient is computed (Note [Overlapped
// input gradients] in parallel/tensor/layers.h). Waiting for it inside the layer's own
// backward hides the sum under the weight gradient's product only. await_gradient(x) puts
// the wait on the graph instead: it returns an alias of x through an AwaitGradient node,
// and the layer's backward registers its sum's wait there. That node is deferred
// (Node::deferred()): the engine runs it, and with it everything that needs the summed
// gradient, only when no other node is ready, so every independent piece of backward that
// is ready computes while the sum travels; with a micro-batch cut into pieces (Note
// [Batch-split overlap] in models/gpt2/batch_split.h) those are the other pieces' layers.
// The order is a function of the graph alone, never of timing (a deferred node is not
// polled for completion), so every rank of a group starts its collectives in the same order,
// as the communicators require (Note [Communicator contract] in
// parallel/comm/communicator.h).
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "core/tensor.h"

namespace tessera {

// The wait an op registers for the gradient that reaches an AwaitGradient node.
class GradientWait {
 public:
  // Registers `wait` (replacing one that already ran, or that a failed backward left).
  void set(std::function<void()> wait) { wait_ = std::move(wait); }
  // Runs the registered wait, if any, and forgets it; rethrows its error.
  void run();

 private:
  std::function<void()> wait_;
};

// y = x (an alias). When grad mode is on and x requires grad, y's gradient passes to x
// through a deferred node that first runs what was registered on the returned GradientWait
// (Note [Deferred gradient waits]); the op that consumes y registers it in its backward,
// before it returns y's gradient. Otherwise y is x and nothing runs the wait. The wait
// object lives as long as the graph or the registering op holds it.
std::pair<Tensor, std::shared_ptr<GradientWait>> await_gradient(const Tensor& x);  // (*) -> (*)

}  // namespace tessera
