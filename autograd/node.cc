#include "autograd/node.h"

#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"

namespace tessera {
namespace {
thread_local uint64_t next_sequence_nr = 0;
}

Node::Node() : sequence_nr_(next_sequence_nr++) {}

TensorList FunctionNode::apply(const TensorList& grad_outputs) {
  TS_CHECK(backward_ != nullptr, "[backward] the graph of ", name_,
           " was already freed by an earlier backward: pass retain_graph = true to the first "
           "backward to run another");
  return backward_(grad_outputs);
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
