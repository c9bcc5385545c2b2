// ZeroOptimizer's backward passes (Note [ZeRO stages] in zero_optimizer.h): backward() with
// its reductions, for both parts with experts (Note [Expert parameters]), and a pipeline
// stage's backward_unreduced() and reduce_gradients().
#include "autograd/engine.h"
#include "core/error.h"
#include "core/factories.h"
#include "kernels/elementwise.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::parallel {

void ZeroOptimizer::backward(const Tensor& loss, double scale, bool boundary) {
  // Whatever fails, neither part is left in its backward state, nor with reductions started
  // and unfinished.
  begin_backward(boundary);
  try {
    if (experts_) experts_->begin_backward(boundary);
  } catch (...) {
    abort_backward();
    throw;
  }
  try {
    const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
    tessera::backward(loss, scalar_tensor(scale * loss_scale, {loss.dtype(), loss.device()}));
  } catch (...) {
    abort_backward();
    if (experts_) experts_->abort_backward();
    throw;
  }
  try {
    end_backward();
  } catch (...) {
    if (experts_) experts_->abort_backward();
    throw;
  }
  if (experts_) experts_->end_backward();
}

void ZeroOptimizer::begin_backward(bool boundary) {
  const bool every_micro_batch = gradients_->reduces_every_micro_batch();
  reducing_ = every_micro_batch || boundary;
  const bool from_hooks = every_micro_batch || config_.overlap_comm;
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    pending_[b] = layout_.blocks[b].end_param - layout_.blocks[b].first_param;
    reduced_[b] = false;
  }
  in_backward_ = reducing_ && from_hooks;
  weights_->begin_backward();
}

void ZeroOptimizer::abort_backward() noexcept {
  in_backward_ = false;
  try {
    weights_->end_backward();
  } catch (...) {  // the backward pass's error is the one to report
  }
  gradients_->drop_collected();
  try {
    gradients_->finish_reductions();  // the started ones still pair with the peers'
  } catch (...) {                     // the backward pass's error is the one to report
  }
}

void ZeroOptimizer::end_backward() {
  in_backward_ = false;
  weights_->end_backward();
  if (!reducing_) {
    gradients_->end_micro_batch();
    return;
  }
  // Blocks the hooks did not reduce: all of them without overlap, and any block with a
  // parameter that got no gradient. Every rank takes them in the same order.
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    if (!reduced_[b]) reduce_block(static_cast<int64_t>(b));
  }
  gradients_->reduce_collected();
  gradients_->finish_reductions();
}

void ZeroOptimizer::backward_unreduced(const Tensor& root, const Tensor& grad, bool loss,
                                       const Tensor& extra, const Tensor& loss_seed) {
  TS_CHECK(!gradients_->reduces_every_micro_batch(),
           "[zero] pipeline backward needs ZeRO stage 0 or 1, found stage ", config_.stage,
           " (it reduces during backward, before the tied gradients are summed)");
  reducing_ = false;
  in_backward_ = false;
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  // `t` times the loss scale, in t's dtype.
  const auto scaled = [scale](const Tensor& t, DType dtype) {
    const Tensor d = t.to(dtype);
    return scale == 1.0 ? d
                        : kernels::binary(kernels::BinaryOp::mul, d,
                                          scalar_tensor(scale, {dtype, d.device()}));
  };
  const Tensor seed = loss ? scaled(grad, grad.dtype()) : grad;
  if (!extra.defined()) return tessera::backward(root, seed);
  tessera::backward({root, extra}, {seed, scaled(loss_seed, extra.dtype())});
}

void ZeroOptimizer::reduce_gradients() {
  TS_CHECK(!gradients_->reduces_every_micro_batch(),
           "[zero] reduce_gradients is for stages 0-1, found stage ", config_.stage);
  for (size_t b = 0; b < layout_.blocks.size(); ++b) reduce_block(static_cast<int64_t>(b));
  gradients_->finish_reductions();
  if (experts_) experts_->reduce_gradients();
}

}  // namespace tessera::parallel
