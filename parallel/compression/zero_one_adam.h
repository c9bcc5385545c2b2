// 0/1 Adam (Lu et al., arXiv:2202.06009; DeepSpeed's ZeroOneAdam,
// deepspeed/runtime/fp16/onebit/zoadam.py), following the timeline of Note [0/1 Adam
// timeline] in onebit_schedule.h.
//
// While the variance adapts, variance steps update both moments from gradients averaged
// in full precision, and the steps between them update the momentum from gradients
// averaged by the 1-bit all-reduce (error feedback on the gradient). Once the variance is
// frozen (and the error buffers reset, once), every step updates this rank's momentum and
// parameters locally; a sync step then averages the update accumulated since the last
// sync, in momentum units, in 1 bit, makes the lr-weighted mean momentum the new
// momentum, and applies the averaged update to the parameters of the last sync.
//
// Unlike DeepSpeed, which accumulates the local updates in a buffer u and undoes them with
// p -= u (not exact in floating point), Tessera keeps the parameters of the last sync (the
// anchor) and sets p = anchor + averaged update: after every sync the ranks' parameters
// are bitwise equal. Between syncs they differ, and so do the momenta: both are per-rank
// state in checkpoints (rank_state()).
#pragma once

#include "parallel/compression/onebit_config.h"
#include "parallel/compression/onebit_optimizer.h"

namespace tessera::parallel {

class ZeroOneAdam final : public OneBitOptimizer {
 public:
  // adam: betas, eps; onebit: var_freeze_step, var_update_scaler, local_step_scaler,
  // local_step_clipper.
  ZeroOneAdam(std::vector<optim::ParamGroup> groups, Communicator& dp,
              const optim::AdamOptions& adam, const OneBitOptions& onebit);
  void step() override;
  std::string name() const override { return "ZeroOneAdam"; }
  bool set_momentum(double beta1) override;
  bool reduce_gradients_next() const override;
  OneBitStep next_step_kind() const override;
  // Beyond the error buffers, once the variance is frozen: this rank's momenta
  // ("exp_avg.<name>"), parameters ("param.<name>"), parameters at the last sync
  // ("anchor.<name>") and the learning rates summed since it ("lrs", f64, one per group).
  StateDict rank_state() const override;
  // Also restarts the local phase from the current parameters (anchor = p, lrs = 0).
  void reset_rank_state() override;

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void load_extra_rank_state(const StateDict& extra) override;

 private:
  // The schedule after step_count() steps (replayed after a load changed the count).
  const ZeroOneAdamSchedule& schedule() const;
  void onebit_gradient_step(size_t gi);
  void local_step(size_t gi, bool sync);

  optim::AdamOptions adam_;
  OneBitOptions onebit_;
  mutable ZeroOneAdamSchedule schedule_;
  std::vector<Tensor> anchors_;  // per parameter, in group order
  Tensor lrs_;                   // (groups) f64 on the CPU
};

}  // namespace tessera::parallel
