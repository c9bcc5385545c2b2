// The communication-compressed optimizers (1-bit Adam, 0/1 Adam, 1-bit LAMB) as
// optim::Optimizer subclasses that communicate over a data-parallel group themselves.
//
// parallel::ZeroOptimizer (stage 0) drives them: before each backward it asks
// reduce_gradients_next() whether to all-reduce the gradients in full precision (DeepSpeed's
// engine.enable_backward_allreduce); when not, step() reads each rank's local gradient and
// communicates in 1 bit. Every rank of the group must call step() in lockstep.
//
// Note [1-bit decisions]
// Where DeepSpeed has quirks (deepspeed/runtime/fp16/onebit/), Tessera decides as follows:
// - Step 1 is DeepSpeed's dummy initialization step: it counts, but changes nothing (its
//   gradient is dropped, unreduced). Kept so that freeze_step and var_freeze_step mean the
//   same steps as in DeepSpeed configs, at the cost of one batch.
// - No bias correction, and weight decay as p -= lr (m / (sqrt(v) + eps) + wd p), as
//   DeepSpeed (the warm-up uses the fused AdamW/LAMB kernels with bias correction off,
//   which compute the same decay as p (1 - lr wd)).
// - Gradient accumulation: DeepSpeed divides the loss by the accumulation steps only while
//   its full-precision all-reduce is on, so compressed steps see the micro-batches' *sum*,
//   an accumulation-dependent step size. Tessera's gradient is always the mean over the
//   micro-batches (the caller's 1 / gas), compressed or not.
// - Buffers compressed per call: 1-bit Adam and 0/1 Adam compress one flat buffer per
//   parameter group (DeepSpeed's fp16 path, the configuration its convergence results
//   use); 1-bit LAMB one flat buffer over every parameter, each parameter's momentum
//   scaled to a common RMS first (DeepSpeed's scaling_coeff). Fewer, larger collectives.
// - Checkpoints: the error-feedback buffers (and 0/1 Adam's local momentum, parameters and
//   sync point) differ between ranks and are saved per rank (rank_state()), so a resume at
//   the same world size is bit for bit. At another world size they are reset, with a
//   warning (DeepSpeed always resets them).
// - exp_avg_mask and non_freeze parameter groups are not implemented.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optim/config.h"
#include "optim/optimizer.h"
#include "parallel/comm/communicator.h"
#include "parallel/compression/compressed_allreduce.h"
#include "parallel/compression/onebit_schedule.h"

namespace tessera::parallel {

class OneBitOptimizer : public optim::Optimizer {
 public:
  // Whether the gradients of the next step() must be averaged over the group in full
  // precision before it; otherwise step() takes this rank's local gradient.
  virtual bool reduce_gradients_next() const = 0;
  // What the next step() does (for logs and benchmarks).
  virtual OneBitStep next_step_kind() const = 0;

  // The state that differs between ranks, as named live tensors: "worker_error.<g>" and
  // "server_error.<g>" per compressed buffer g, and whatever the optimizer adds.
  virtual StateDict rank_state() const;
  // Restores this rank's rank_state() saved at the same world size; every name, shape and
  // dtype is checked before anything is written.
  void load_rank_state(const StateDict& saved);
  // Starts the per-rank state afresh after a resume at another world size.
  virtual void reset_rank_state();

 protected:
  // `buffers`: the numel of each compressed buffer (one CompressedAllReduce each).
  OneBitOptimizer(std::vector<optim::ParamGroup> groups, Communicator& dp,
                  const std::vector<int64_t>& buffers);
  // Called by load_rank_state() with the entries rank_state() holds beyond the error
  // buffers, already checked against rank_state()'s names, shapes and dtypes.
  virtual void load_extra_rank_state(const StateDict& extra) {}

  // The numel of each group (a buffer per group) and of all groups (one buffer).
  static std::vector<int64_t> numel_per_group(const std::vector<optim::ParamGroup>& groups);
  static std::vector<int64_t> numel_of_all(const std::vector<optim::ParamGroup>& groups);

  CompressedAllReduce& compressor(size_t buffer) { return *compressors_[buffer]; }
  // The full-precision step of 1-bit Adam and 0/1 Adam: Adam without bias correction on
  // group g's (averaged) gradients, as step t.
  void adam_step(const optim::ParamGroup& g, int64_t t, const optim::AdamOptions& adam);
  // This rank's gradient of p (zeros when backward did not reach it, so that every rank
  // communicates the same sizes).
  static Tensor grad_of(const NamedParameter& p);

  Communicator& dp_;

 private:
  std::vector<std::unique_ptr<CompressedAllReduce>> compressors_;
};

// Copies between a list of tensors and one flat f32 buffer holding them end to end.
class FlatView {
 public:
  explicit FlatView(std::vector<Tensor> parts);
  int64_t numel() const { return numel_; }
  // A new (numel) buffer holding the parts in order.
  Tensor gather() const;
  // Writes `flat` (numel) back into the parts.
  void scatter(const Tensor& flat) const;

 private:
  std::vector<Tensor> parts_;
  int64_t numel_ = 0;
};

// The Adam-form arithmetic of the compressed stages, in place on contiguous f32 tensors.
// m = beta1 m + (1 - beta1) g.
void momentum_update_(const Tensor& m, const Tensor& g, double beta1);
// sqrt(v) + eps, a new tensor.
Tensor adam_denominator(const Tensor& v, double eps);
// p -= lr (m / denom + wd p).
void adam_update_(const Tensor& p, const Tensor& m, const Tensor& denom, double lr, double wd);

// The 1-bit optimizer `config` names (onebit_config(config)) over `groups`, communicating over
// `dp`, which must outlive it.
std::unique_ptr<OneBitOptimizer> make_onebit_optimizer(const optim::OptimizerConfig& config,
                                                       std::vector<optim::ParamGroup> groups,
                                                       Communicator& dp);

}  // namespace tessera::parallel
