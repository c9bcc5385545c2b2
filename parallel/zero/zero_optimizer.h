// ZeroOptimizer: data-parallel training with ZeRO stages 0-3 over a Communicator.
//
//   ZeroOptimizer zero(dp, model, optim::decay_groups(...), config.optimizer, config.zero);
//   for each step:
//     zero.zero_grad();
//     for each micro-batch m of gas: zero.backward(loss_m, 1.0 / gas, m == gas - 1);
//     const double norm = zero.clip_grad_norm(config.gradient_clipping);
//     zero.step();
//
// Note [ZeRO stages]
// At construction the trainable parameters become views into one flat, padded parameter
// buffer (flat_layout.h), identical on every rank (broadcast from rank 0). Per stage:
//   0  Gradients live in a flat buffer of the same layout; at the accumulation boundary
//      each block is all-reduced and averaged, and every rank steps every parameter.
//   1  The same flat gradients; at the boundary each block is reduce-scattered, so a rank
//      holds the averaged gradient of the chunks it owns, and keeps optimizer state for
//      those chunks only (1/W of it). After its step each block is all-gathered.
//   2  As 1, but no full gradient buffer: as a block's gradients complete in backward
//      (post-accumulate hooks), they are copied into a block buffer, reduce-scattered,
//      added into this rank's gradient shard and dropped. Every micro-batch communicates.
//   3  As 2, and the parameters are partitioned too: a rank keeps 1/W of each parameter
//      and gathers whole parameters only around the module calls that read them
//      (partitioned_params.h, Note [ZeRO-3 parameters]). Each parameter is its own block.
// With overlap_comm, stages 0 and 1 also reduce from the hooks, on the boundary micro-batch.
// The communicators here block, so "overlap" means blocks are reduced while backward is
// still producing later ones (bounded memory), not concurrent compute and transfer.
//
// Reductions are sums in rank order and averaging is one multiply, so all ranks hold
// bitwise identical gradients, norms and parameters. Against one process with the same
// global batch, results differ only by summation order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/module.h"
#include "core/tensor.h"
#include "optim/config.h"
#include "optim/optimizer.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/partitioned_params.h"
#include "parallel/zero/zero_config.h"

namespace tessera::parallel {

// Bytes of model state one rank holds (the buffers the optimizer owns).
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
};

class ZeroOptimizer {
 public:
  // `groups` as optim::decay_groups(model) makes them; every parameter must be a
  // contiguous f32 CPU tensor that requires grad. LAMB with stage >= 1 is refused. Stage 3
  // installs its hooks on `model`; its forwards must open a ModuleCall wherever they read
  // parameters (autograd/module.h). The destructor removes the hooks; a stage 3 model's
  // partitioned parameters then hold no values (take whole_parameters() before).
  ZeroOptimizer(Communicator& dp, Module& model, std::vector<optim::ParamGroup> groups,
                const optim::OptimizerConfig& optimizer, const ZeroConfig& zero);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Starts an optimizer step: the gradients of the previous one are discarded.
  void zero_grad();
  // backward(loss, scale) for one micro-batch; `boundary` marks the last micro-batch of
  // the step, after which every gradient has been reduced.
  void backward(const Tensor& loss, double scale, bool boundary);
  // The L2 norm of the averaged gradient over all parameters, each element counted once;
  // when max_norm > 0 and max_norm / (norm + 1e-6) < 1 the gradients are scaled by that,
  // as optim::clip_grad_norm does. Call after the boundary's backward.
  double clip_grad_norm(double max_norm);
  // The optimizer step on this rank's shard; then the parameters are all-gathered.
  void step();

  void set_lr(double lr);
  double lr() const;
  // Forwards to Optimizer::set_momentum.
  bool set_momentum(double beta1);
  int64_t step_count() const;

  int stage() const { return config_.stage; }
  const FlatLayout& layout() const { return layout_; }
  Communicator& comm() const { return dp_; }
  ModelStateBytes model_state_bytes() const;

  // Whether state_dict() is this rank's shard (stages 1-3) rather than the whole state.
  bool sharded() const { return config_.stage >= 1; }
  // Stage 0: the optimizer's state_dict() ("step", "<kind>.<parameter name>"). Stages 1-3:
  // this rank's shard: "step" and one tensor of layout().shard_numel() elements per kind
  // ("exp_avg", ...). Tensors may be the live buffers.
  StateDict state_dict() const;
  // Every trainable parameter whole (name -> tensor, flat order). Collective at stage 3,
  // where the parameters are gathered one at a time into new tensors; the model's own
  // tensors otherwise.
  StateDict whole_parameters();
  // Stage 3: this rank's shard of the parameters (layout().shard_numel() elements, the
  // live buffer). Other stages hold whole parameters in the model.
  Tensor parameter_shard() const;
  // Stage 3: sets every parameter from whole tensors (name -> tensor, like
  // Module::state_dict(); exactly the trainable parameters), all checked before any
  // changes; other stages load into the model directly.
  void load_parameters(const StateDict& whole);
  // The stage 3 parameters (null for other stages).
  const PartitionedParams* partitioned() const { return partitioned_.get(); }
  // Loads whole per-parameter state (stage 0's state_dict(), or whole_state() of the shards
  // of any world size), keeping this rank's part. Everything is checked before anything
  // changes.
  void load_whole_state(const StateDict& whole);

 private:
  void on_grad_ready(int64_t param);
  void reduce_block(int64_t block);
  // This rank's chunk of block b in the flat parameter buffer.
  Tensor own_param_chunk(int64_t block) const;
  Tensor own_grad_chunk(int64_t block) const;

  Communicator& dp_;
  Module& model_;
  ZeroConfig config_;
  std::vector<optim::ParamGroup> groups_;
  std::vector<Tensor> params_;  // flat order
  FlatLayout layout_;
  Tensor flat_params_;                              // (layout.numel); stages 0-2
  Tensor param_shard_;                              // (layout.shard_numel()); stage 3
  Tensor flat_grads_;                               // (layout.numel); stages 0-1
  Tensor grad_shard_;                               // (layout.shard_numel()); stages 2-3
  std::shared_ptr<PartitionedParams> partitioned_;  // stage 3; the model's hooks
  std::unique_ptr<optim::Optimizer> inner_;         // over the parameters (0) or the chunks (1-2)
  std::vector<int64_t> pending_;                    // per block: parameters whose hook has not run
  std::vector<bool> reduced_;                       // per block, in the current micro-batch
  bool reducing_ = false;                           // whether this micro-batch reduces
  bool in_backward_ = false;
};

// The whole per-parameter optimizer state ("step", "<kind>.<parameter name>") from the
// shards that the ranks of a stage 1-3 run saved (ZeroOptimizer::state_dict(), rank order)
// under `layout`. All must agree on the step and the kinds.
StateDict whole_state(const FlatLayout& layout, const std::vector<StateDict>& shards);

}  // namespace tessera::parallel
