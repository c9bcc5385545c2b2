#include "autograd/node.h"

#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"

namespace tessera {
namespace {
thread_local uint64_t next_sequence_nr = 0;
}

Node::Node() : sequence_nr_(next_sequence_nr++) {}

bool summable_in_place(const Tensor& slot, const Shape& shape, DType dtype, Device device) {
  return slot.defined() && slot.is_unique() && slot.is_contiguous() && slot.shape() == shape &&
         slot.dtype() == dtype && slot.device() == device;
}

void add_grad(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
  } else if (summable_in_place(slot, g.shape(), g.dtype(), g.device())) {
    kernels::axpy_(slot, g);
  } else {
    slot = kernels::binary(kernels::BinaryOp::add, slot, g);
  }
}

void Node::apply_into(const TensorList& grad_outputs, const std::vector<Tensor*>& slots) {
  const TensorList input_grads = apply(grad_outputs);
  TS_INTERNAL_ASSERT(input_grads.empty() || input_grads.size() == slots.size(), name(),
                     " returned ", input_grads.size(), " gradients for ", slots.size(), " inputs");
  for (size_t i = 0; i < input_grads.size(); ++i) {
    const Tensor& g = input_grads[i];
    if (slots[i] == nullptr || !g.defined()) continue;
    const Edge& e = next_edges()[i];
    const std::vector<OutputInfo>& outs = e.node->outputs();
    TS_INTERNAL_ASSERT(outs.empty() || g.shape() == outs[e.input_nr].shape, name(),
                       " produced a gradient of shape ", shape_str(g.shape()), " for ",
                       e.node->name(), " output of shape ", shape_str(outs[e.input_nr].shape));
    add_grad(*slots[i], g);
  }
}

void FunctionNode::check_not_freed() const {
  TS_CHECK(backward_ != nullptr || backward_into_ != nullptr, "[backward] the graph of ", name_,
           " was already freed by an earlier backward: pass retain_graph = true to the first "
           "backward to run another");
}

TensorList FunctionNode::apply(const TensorList& grad_outputs) {
  check_not_freed();
  if (backward_) return backward_(grad_outputs);
  TensorList input_grads(next_edges().size());
  std::vector<Tensor*> slots(input_grads.size());
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = &input_grads[i];
  backward_into_(grad_outputs, slots);
  return input_grads;
}

void FunctionNode::apply_into(const TensorList& grad_outputs, const std::vector<Tensor*>& slots) {
  check_not_freed();
  if (backward_) {
    Node::apply_into(grad_outputs, slots);
  } else {
    backward_into_(grad_outputs, slots);
  }
}

TensorList AccumulateGrad::apply(const TensorList& grad_outputs) {
  const Tensor& incoming = grad_outputs[0];
  if (!incoming.defined()) return {};
  TS_INTERNAL_ASSERT(incoming.shape() == leaf_.shape(), "gradient of shape ",
                     shape_str(incoming.shape()), " for a leaf of shape ",
                     shape_str(leaf_.shape()));
  AutogradMeta& meta = leaf_.ensure_autograd_meta();
  if (!meta.grad) {
    // Own the gradient: an incoming tensor may be shared with other leaves' gradients.
    meta.grad = std::make_shared<Tensor>(
        incoming.is_contiguous() && incoming.is_unique() ? incoming : incoming.clone());
  } else {
    // In place, so a gradient that views a larger buffer (ZeRO's flat gradients) stays one.
    if (meta.grad->is_contiguous() && meta.grad->dtype() == incoming.dtype()) {
      kernels::axpy_(*meta.grad, incoming);
    } else {
      meta.grad->copy_(kernels::binary(kernels::BinaryOp::add, *meta.grad, incoming));
    }
  }
  // A handle of our own: a hook may drop the leaf's gradient (ZeRO-2 does, once it has
  // reduced it).
  Tensor grad = *meta.grad;
  for (auto& hook : meta.post_accumulate_hooks) hook(grad);
  return {};
}

}  // namespace tessera
