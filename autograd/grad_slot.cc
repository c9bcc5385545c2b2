#include "autograd/grad_slot.h"

#include <utility>

#include "kernels/blas1.h"
#include "kernels/elementwise.h"

namespace tessera {

void add_in_place(const Tensor& sum, const Tensor& g) {
  if (sum.is_contiguous() && sum.dtype() == g.dtype()) {
    kernels::axpy_(sum, g);
  } else {
    sum.copy_(kernels::binary(kernels::BinaryOp::add, sum, g));
  }
}

void GradSlot::sum_into_leaf(Tensor leaf_grad) {
  TS_INTERNAL_ASSERT(!received_ && leaf_grad.is_contiguous(),
                     "a leaf's gradient made the sum of a slot that has one");
  sum_ = std::move(leaf_grad);
  into_leaf_ = true;
}

bool GradSlot::summable_in_place(const Shape& shape, DType dtype, Device device) const {
  // A leaf's buffer is meant to be summed into; any other sum only when nothing else sees it.
  return sum_.defined() && (into_leaf_ || (received_ && sum_.is_unique())) &&
         sum_.is_contiguous() && sum_.shape() == shape && sum_.dtype() == dtype &&
         sum_.device() == device;
}

void GradSlot::add(const Tensor& g) {
  if (!sum_.defined()) {
    sum_ = g;
  } else if (into_leaf_ || summable_in_place(g.shape(), g.dtype(), g.device())) {
    add_in_place(sum_, g);  // a leaf's buffer takes the sum whatever g's dtype
  } else {
    sum_ = kernels::binary(kernels::BinaryOp::add, sum_, g);
  }
  received_ = true;
}

Tensor* GradSlot::in_place(const Shape& shape, DType dtype, Device device) {
  if (!summable_in_place(shape, dtype, device)) return nullptr;
  received_ = true;
  return &sum_;
}

Tensor GradSlot::take() {
  Tensor out = received_ ? std::move(sum_) : Tensor();
  *this = GradSlot();
  return out;
}

}  // namespace tessera
