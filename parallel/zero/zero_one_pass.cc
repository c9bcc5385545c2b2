// ZeroOptimizer's one-pass step (Note [One-pass mixed-precision step] in zero_optimizer.h).
#include <utility>

#include "parallel/zero/zero_optimizer.h"
#include "parallel/zero/zero_state.h"

namespace tessera::parallel {

bool ZeroOptimizer::one_pass_step() const {
  return master_ != nullptr && inner_->supports_scaled_step() && offload_ == nullptr &&
         !host_steps_ && experts_ == nullptr;
}

std::unordered_map<std::string, Tensor> ZeroOptimizer::model_copies() const {
  std::unordered_map<std::string, Tensor> out;
  const std::vector<Tensor> copies = master_->model_copies();
  for (size_t i = 0; i < copies.size(); ++i) {
    // inner_'s parameters: the masters under the parameters' names at stage 0, this
    // rank's chunks at stages 1-2.
    const int64_t k = static_cast<int64_t>(i);
    out.emplace(config_.stage == 0 ? layout_.params[i].name : chunk_name(k), copies[i]);
  }
  return out;
}

bool ZeroOptimizer::step_in_one_pass() {
  const Tensor factor = std::exchange(pending_factor_, Tensor());
  // Without a prepared factor, clip_grad_norm() has scaled the gradients and found any
  // overflow already; with one, the device skips the update on an overflow.
  if (!overflow_) {
    optim::Optimizer::ScaledStep s;
    if (factor.defined()) s.grad_scale = factor.narrow(0, 0, 1);
    if (!model_copies_.empty()) {
      s.model_copy = [this](const NamedParameter& p) { return model_copies_.at(p.name); };
    }
    inner_->scaled_update(s);
    // The step's one host read, after its update is queued.
    if (factor.defined()) read_clip(factor);
  }
  if (scaler_) {
    scaler_->update(overflow_);
    if (overflow_) return false;  // the pass changed nothing; DeepSpeed skips the step
  }
  inner_->finish_step();
  master_->after_rounding_step();
  return true;
}

}  // namespace tessera::parallel
