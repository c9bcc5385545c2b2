#include "autograd/checkpoint.h"

#include <algorithm>
#include <chrono>

#include "autograd/engine.h"
#include "autograd/record.h"
#include "core/clock.h"
#include "core/grad_mode.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

TensorList checkpoint(const SegmentFn& fn, const TensorList& inputs,
                      const std::vector<Generator*>& rngs, const CheckpointPolicy& policy) {
  if (!GradMode::is_enabled()) return fn(inputs);
  std::vector<uint64_t> offsets;
  for (Generator* g : rngs) offsets.push_back(g->offset());
  TensorList outputs;
  const auto t0 = Clock::now();
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  if (policy.at_boundary) policy.at_boundary();
  if (policy.timed) policy.timed(false, seconds_since(t0));
  // The segment may use parameters that require grad even when no input does.
  std::vector<std::function<Tensor()>> kept;
  std::vector<bool> inputs_require;
  for (const Tensor& t : inputs) {
    const Tensor d = t.detach();
    if (policy.keep && d.defined()) {
      kept.push_back(policy.keep(d));
    } else {
      kept.push_back([d] { return d; });
    }
    inputs_require.push_back(t.requires_grad());
  }
  auto node = std::make_shared<FunctionNode>(
      "checkpoint", [fn, kept, inputs_require, rngs, offsets, policy](const TensorList& grads) {
        const auto start = Clock::now();
        if (policy.at_boundary) policy.at_boundary();
        // Rewind the generators, recompute with recording on, and backpropagate.
        std::vector<uint64_t> resume;
        for (size_t i = 0; i < rngs.size(); ++i) {
          resume.push_back(rngs[i]->offset());
          rngs[i]->set_offset(offsets[i]);
        }
        TensorList leaves;
        for (size_t i = 0; i < kept.size(); ++i) {
          Tensor leaf = kept[i]().detach();
          if (inputs_require[i]) leaf.set_requires_grad(true);
          leaves.push_back(leaf);
        }
        TensorList recomputed;
        {
          EnableGradGuard enable;
          recomputed = fn(leaves);
        }
        for (size_t i = 0; i < rngs.size(); ++i) rngs[i]->set_offset(resume[i]);
        TensorList roots, seeds;
        for (size_t i = 0; i < recomputed.size(); ++i) {
          if (recomputed[i].requires_grad()) {
            roots.push_back(recomputed[i]);
            seeds.push_back(grads[i]);
          }
        }
        if (!roots.empty()) backward(roots, seeds);
        TensorList input_grads;
        for (const Tensor& leaf : leaves)
          input_grads.push_back(leaf.requires_grad() ? leaf.grad() : Tensor());
        if (policy.at_boundary) policy.at_boundary();
        if (policy.timed) policy.timed(true, seconds_since(start));
        return input_grads;
      });
  // Record even when no input requires grad: parameters inside fn still need theirs.
  record(node, inputs, outputs);
  return outputs;
}

Tensor checkpoint_sequential(Tensor x, size_t n, int64_t interval,
                             const std::function<Tensor(size_t, const Tensor&)>& layer,
                             const std::vector<Generator*>& rngs, const CheckpointPolicy& policy) {
  if (interval <= 0 || !GradMode::is_enabled()) {
    for (size_t i = 0; i < n; ++i) x = layer(i, x);
    return x;
  }
  const size_t k = static_cast<size_t>(interval);
  for (size_t first = 0; first < n; first += k) {
    const size_t end = std::min(n, first + k);
    x = checkpoint(
        // By value: backward recomputes the segment after this function has returned.
        [layer, first, end](const TensorList& in) {
          Tensor y = in[0];
          for (size_t i = first; i < end; ++i) y = layer(i, y);
          return TensorList{y};
        },
        {x}, rngs, policy)[0];
  }
  return x;
}

}  // namespace tessera
