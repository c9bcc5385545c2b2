#include "autograd/node.h"

#include "core/grad_mode.h"

namespace tessera {
namespace {
thread_local uint64_t next_sequence_nr = 0;
}

Node::Node() : sequence_nr_(next_sequence_nr++) {}

void Node::apply_into(const TensorList& grad_outputs, const std::vector<GradSlot*>& slots) {
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
    slots[i]->add(g);
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
  // As the engine gives them: no slot where no gradient is wanted.
  std::vector<GradSlot> sums(next_edges().size());
  std::vector<GradSlot*> slots(sums.size(), nullptr);
  for (size_t i = 0; i < slots.size(); ++i) {
    if (next_edges()[i].valid()) slots[i] = &sums[i];
  }
  backward_into_(grad_outputs, slots);
  TensorList input_grads;
  for (GradSlot& s : sums) input_grads.push_back(s.take());
  return input_grads;
}

void FunctionNode::apply_into(const TensorList& grad_outputs, const std::vector<GradSlot*>& slots) {
  check_not_freed();
  if (backward_) {
    Node::apply_into(grad_outputs, slots);
  } else {
    backward_into_(grad_outputs, slots);
  }
}

Tensor AccumulateGrad::start_summing_into_gradient() {
  const AutogradMeta* meta = leaf_.autograd_meta();
  if (meta == nullptr || !meta->grad) return Tensor();
  const Tensor& grad = *meta->grad;
  const bool fits = grad.defined() && grad.is_contiguous() && grad.shape() == leaf_.shape() &&
                    grad.dtype() == leaf_.dtype() && grad.device() == leaf_.device();
  summed_into_ = fits ? grad : Tensor();
  return summed_into_;
}

TensorList AccumulateGrad::apply(const TensorList& grad_outputs) {
  const Tensor summed_into = std::exchange(summed_into_, Tensor());
  const Tensor& incoming = grad_outputs[0];
  if (!incoming.defined()) return {};
  TS_INTERNAL_ASSERT(incoming.shape() == leaf_.shape(), "gradient of shape ",
                     shape_str(incoming.shape()), " for a leaf of shape ",
                     shape_str(leaf_.shape()));
  AutogradMeta& meta = leaf_.ensure_autograd_meta();
  if (meta.grad && incoming.is_same(*meta.grad)) {
    // Summed into in place already (Note [Gradients accumulated into leaves]).
  } else if (summed_into.defined() && incoming.is_same(summed_into)) {
    TS_CHECK(false, "[backward] the gradient of a leaf ", leaf_.str(),
             " was replaced while backward summed into it; expected it unchanged until the "
             "leaf's gradients were all added");
  } else if (!meta.grad) {
    // Own the gradient: an incoming tensor may be shared with other leaves' gradients.
    meta.grad = std::make_shared<Tensor>(
        incoming.is_contiguous() && incoming.is_unique() ? incoming : incoming.clone());
  } else {
    add_in_place(*meta.grad, incoming);
  }
  // A handle of our own: a hook may drop the leaf's gradient (ZeRO-2 does, once it has
  // reduced it).
  Tensor grad = *meta.grad;
  for (auto& hook : meta.post_accumulate_hooks) hook(grad);
  return {};
}

}  // namespace tessera
