// Optimizer: parameter groups, gradient bookkeeping and state for exact resume.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/module.h"
#include "core/tensor.h"

namespace tessera::optim {

// Parameters that share hyperparameters. Names key the optimizer state in checkpoints.
struct ParamGroup {
  std::vector<NamedParameter> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
};

// Splits `params` into a decayed group and a group with weight_decay 0: parameters with
// fewer than 2 dims (biases, LayerNorm weights) when `exclude_1d`, and any whose name
// contains one of `exclude_names`. Empty groups are dropped.
std::vector<ParamGroup> decay_groups(const std::vector<NamedParameter>& params, double lr,
                                     double weight_decay, bool exclude_1d,
                                     const std::vector<std::string>& exclude_names);

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter from its .grad(); parameters without a grad are skipped.
  virtual void step() = 0;

  // Note [A step in parts]
  // NVMe offload streams the optimizer's state through memory a few parameters at a time
  // (parallel/offload/), so it takes a step in parts: update_part(selected) updates the
  // parameters `selected` accepts as step() would, at the step count of the step in
  // progress, and finish_step() ends the step. Parts that select every parameter once give
  // step()'s bits: a parameter's update reads only its own gradient and state, and the
  // step's scalars (the step count, each group's hyperparameters) do not change between
  // the parts. Adam, AdamW and SGD support it. The 1-bit optimizers compress all their
  // gradients together; LAMB could, but needs ZeRO stage 0, where nothing is offloaded.
  using ParamSelection = std::function<bool(const NamedParameter&)>;
  virtual bool supports_parts() const { return false; }
  // Throws unless supports_parts().
  virtual void update_part(const ParamSelection& selected);
  void finish_step() { advance(); }
  virtual std::string name() const = 0;

  // Note [Scaled steps]
  // A mixed-precision step (parallel/zero/zero_optimizer.h, Note [One-pass mixed-precision
  // step]) hands the optimizer the gradients' unscale-and-clip factor as a device scalar,
  // and where the model's 16-bit weights are, instead of scaling the gradients and rounding
  // the masters in passes of their own. scaled_update(s) updates every parameter with a
  // gradient as step() would after scale_(grad, factor), rounds each updated value into
  // s.model_copy(p) where that is defined, and leaves everything unchanged when the factor
  // is not finite (the device decides; no host read). The step count does not move:
  // finish_step() ends the step, which the caller does once it knows it was not skipped.
  // AdamW and Adam support it (kernels::adamw_step's grad_scale and model copies).
  struct ScaledStep {
    Tensor grad_scale;  // one f64 element on the parameters' device; undefined: 1
    // The 16-bit tensor parameter p is rounded into, for every parameter or for none
    // (null: none).
    std::function<Tensor(const NamedParameter&)> model_copy;
  };
  virtual bool supports_scaled_step() const { return false; }
  // Throws unless supports_scaled_step().
  virtual void scaled_update(const ScaledStep& s);

  // Drops every parameter's gradient.
  void zero_grad();
  // Sets the learning rate of every group (what LR schedules drive).
  void set_lr(double lr);
  double lr() const { return groups_.empty() ? 0.0 : groups_.front().lr; }
  // The first-moment coefficient that OneCycle cycles (Adam beta1, SGD momentum); false
  // when the optimizer has none.
  virtual bool set_momentum(double beta1) { return false; }

  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Optimizer steps taken.
  int64_t step_count() const { return step_count_; }

  // Everything needed to continue bit for bit: per-parameter state tensors named
  // "<state>.<param name>" (e.g. "exp_avg.transformer.wte.weight"), shaped like the
  // parameter or 0-dim (scalar_state), plus "step", a 0-dim i64 tensor. Tensors are the
  // live buffers, not copies.
  StateDict state_dict() const;
  // Restores state_dict() output; names, shapes and dtypes must match exactly, and all are
  // checked before anything is written.
  void load_state_dict(const StateDict& saved);
  // load_state_dict() in parts, for state that does not fit in memory at once (NVMe
  // offload, Note [A step in parts]): begin_load(saved) checks all of `saved`, drops the
  // state and sets the step count; then load_part(saved, selected) makes the state of the
  // parameters `selected` accepts from their entries of `saved`. Parts that select every
  // parameter once give load_state_dict()'s state. Until its part is loaded, a parameter
  // has no state.
  void begin_load(const StateDict& saved);
  void load_part(const StateDict& saved, const ParamSelection& selected);
  // Throws what load_state_dict(saved) would find wrong, changing nothing.
  void check_state_dict(const StateDict& saved) const;

 protected:
  // Called by state_dict()/load_state_dict(): the state kinds this optimizer keeps for a
  // parameter, created (zero-filled, like the parameter) on first use.
  virtual std::vector<std::string> state_names() const = 0;
  // Whether `kind` holds one f32 number per parameter (a 0-dim tensor, like 1-bit LAMB's
  // frozen trust ratio) rather than a tensor shaped like the parameter.
  virtual bool scalar_state(const std::string& kind) const { return false; }
  Tensor& state(const std::string& kind, const NamedParameter& p);
  // Whether state(kind, p) exists yet (SGD starts its momentum buffer from the gradient).
  bool has_state(const std::string& kind, const NamedParameter& p) const;
  void advance() { ++step_count_; }

  std::vector<ParamGroup> groups_;

 private:
  struct LoadTarget {
    std::string kind;
    const NamedParameter* param;
    Tensor value;
  };
  // The entries of `saved` (state_dict()'s form) with the parameter each is for, and its
  // step in `*step`; throws at the first entry that does not fit.
  std::vector<LoadTarget> load_targets(const StateDict& saved, int64_t* step) const;

  // kind -> per parameter, in group order.
  std::vector<std::pair<std::string, std::vector<Tensor>>> state_;
  int64_t step_count_ = 0;
  // Position of each parameter in group order, by name.
  std::map<std::string, size_t> index_;
};

}  // namespace tessera::optim
