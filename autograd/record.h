// Recording ops on the graph: the glue between a forward and its backward node.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "autograd/node.h"

namespace tessera {

// True when grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const TensorList& inputs);

// The edge a gradient for `t` must follow: its grad_fn, its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);

// Makes `node` the producer of `outputs`, taking gradients to `inputs` (in order: the
// node's backward returns one gradient per input). Outputs become non-leaves that require
// grad; an output that already carries autograd state is first replaced by a fresh alias.
void record(const std::shared_ptr<Node>& node, const TensorList& inputs,
            std::initializer_list<Tensor*> outputs);
void record(const std::shared_ptr<Node>& node, const TensorList& inputs,
            std::vector<Tensor>& outputs);

// Shorthand: records a FunctionNode named `name` with `backward` when needs_grad(inputs).
void record_function(const std::string& name, const TensorList& inputs,
                     std::initializer_list<Tensor*> outputs, FunctionNode::Backward backward);
// The same for a backward that adds its gradients into the slots (Note [Gradients added in
// place]).
void record_function(const std::string& name, const TensorList& inputs,
                     std::initializer_list<Tensor*> outputs,
                     FunctionNode::BackwardInto backward_into);

// Registers fn(grad) to run on a leaf's accumulated gradient after each backward that
// reaches it (used to start gradient communication while backward continues). fn may drop
// the gradient with leaf.set_grad(Tensor()) once it has used it.
void register_post_accumulate_hook(Tensor& leaf, std::function<void(Tensor&)> fn);

}  // namespace tessera
