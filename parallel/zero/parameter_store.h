// Where a ZeRO stage keeps the parameters the optimizer steps (Note [ZeRO stages] and Note
// [Mixed precision] in parallel/zero/zero_optimizer.h):
//   MasterWeights      stages 0-2: one flat f32 buffer on every rank, the parameters its
//                      views; with f16/bf16 the parameters are views of a flat 16-bit
//                      buffer, rounded from the f32 masters after each step (whole masters
//                      at stage 0, this rank's shard of them at stages 1-2), and f16 has
//                      the loss scaler
//   PartitionedWeights stage 3: each rank keeps its shard; whole parameters are gathered
//                      around the module calls that read them (partitioned_params.h)
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "autograd/module.h"
#include "core/tensor.h"
#include "optim/loss_scaler.h"
#include "parallel/comm/communicator.h"
#include "parallel/offload/tensor_swapper.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/partitioned_params.h"
#include "parallel/zero/zero_config.h"

namespace tessera::parallel {

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  // This rank's f32 chunk of block `block`: what its optimizer steps at stages 1-3.
  virtual Tensor own_chunk(int64_t block) const = 0;
  // After the optimizer stepped: every rank's parameters take the new values.
  virtual void after_step() = 0;
  // Every parameter whole in f32, flat order (collective where the store is sharded: stage
  // 3, and 16-bit parameters at stages 1-2, whose gathered masters are host tensors).
  virtual std::vector<Tensor> whole() = 0;
  // Sets every parameter from whole f32 tensors (flat order), on every rank alike.
  virtual void load(const std::vector<Tensor>& whole) = 0;
  // Bytes of the parameter buffers this rank holds.
  virtual int64_t bytes() const = 0;
  // Whether the store keeps the f32 parameters sharded (stage 3; the masters of 16-bit
  // parameters at stages 1-2).
  virtual bool sharded_parameters() const { return false; }
  // A checkpoint then saves own_chunk() of every block (ZeroOptimizer::shard_pieces).
  // Whether the optimizer step rounds each updated f32 master chunk into the 16-bit
  // parameters itself, with round_chunk() while the chunk is in memory (NVMe offload swaps
  // the masters: Note [ZeRO's offloaded state] in parallel/zero/zero_offload.h), so that
  // after_step() does not.
  virtual bool rounds_in_step() const { return false; }
  // With `staging` defined (pinned host memory) and the 16-bit chunk on a CUDA device, the
  // conversion goes through it and its copy is queued (round_into), so the host goes on
  // while it travels.
  virtual void round_chunk(int64_t block, const Tensor& staging) {}
  // Backward's progress, for stores that gather parameters (stage 3).
  virtual void begin_backward() {}
  virtual void grad_ready(int64_t param) {}
  virtual void end_backward() {}
  // Waits for every gather still travelling (started through AsyncCollectives), so that
  // the caller may use the group or read any parameter through the device's queue (on NCCL
  // the device, not the host, waits: Note [Device-queued operations]). Every handle is
  // waited for; the first error is rethrown after.
  virtual void settle() {}
};

// Note [Gathers after the step]
// With sharded masters (stages 1-2) every block's updated chunks are all-gathered after the
// step. With async collectives (gather_in_background: overlap_comm) after_step() starts
// those gathers and returns: they travel, on the worker or NCCL's stream, while the next
// forward computes. Installed as the model's ModuleHooks, the store waits in each module
// call's pre_forward for the gathers of the blocks holding that module's own parameters,
// so no module reads a parameter before its new value has arrived. The gathers are
// started in the order the forwards before the first step first needed their blocks (the
// flat layout groups parameters by weight decay, not by use), then the blocks none needed,
// so the first modules' parameters arrive first. Rank 0's order is broadcast at the first
// step and kept, so every rank gathers in the same order whatever forwards only some ranks
// ran (sampling, say). The engine's pipeline path waits for the gathers before its loss
// mean, so there they do not reach into the next forward. settle() waits for the
// rest (parameters no forward reads), and every path that reads parameters outside a
// forward (saving, loading, another step) goes through it (ZeroOptimizer's
// settle_communication). The gathers, their order and their values are the blocking ones,
// so the parameters are the same bits. DeepSpeed's stage 1-2 optimizer all-gathers at the
// end of its step, blocking (deepspeed/runtime/zero/stage_1_and_2.py).
class MasterWeights final : public ParameterStore {
 public:
  // Makes `params` (flat order of `layout`; `dtype` f32, f16 or bf16, on `device`) views of
  // the flat buffers, with rank 0's values on every rank. `sharded` (stages 1-2): a rank
  // steps its own chunks, which after_step() all-gathers (in 16 bits with f16/bf16, whose
  // f32 masters are then only this rank's chunks). `params` and `layout` must outlive this.
  // `host_masters` (sharded 16-bit masters of a run that offloads its optimizer: Note
  // [Offload on a GPU] in zero_optimizer.h) keeps the master chunks in host memory, and the
  // step rounds them into the device's 16-bit chunks (as after round_chunks_in_step()).
  MasterWeights(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                DType dtype, Device device, bool sharded, const optim::LossScalerConfig& scaler,
                bool host_masters = false);
  // Removes the hooks gather_in_background() installed.
  ~MasterWeights() override;

  Tensor own_chunk(int64_t block) const override;
  void after_step() override;
  // Collective with sharded masters: they are all-gathered into new host tensors.
  std::vector<Tensor> whole() override;
  void load(const std::vector<Tensor>& whole) override;
  int64_t bytes() const override;
  bool sharded_parameters() const override { return !master_chunks_.empty(); }

  // Per parameter, the f32 tensor the optimizer steps: the f32 master's view (f16/bf16), or
  // the parameter itself (f32). Not with sharded masters.
  const std::vector<Tensor>& masters() const;
  // Rounds the f32 masters into the 16-bit model buffer (nothing at f32); with sharded
  // masters, this rank's chunks, then all-gathers them (collective).
  void round_into_model();
  // Where the optimizer's step rounds the masters itself (Note [One-pass mixed-precision
  // step] in zero_optimizer.h): per f32 tensor it steps, the 16-bit tensor of the model
  // buffer it is rounded into: each parameter's view at stage 0, this rank's chunk of each
  // block with sharded masters (block order). Empty at f32.
  std::vector<Tensor> model_copies() const;
  // after_step() for a step that rounded the masters into model_copies(): only the gathers.
  void after_rounding_step();
  // NVMe offload keeps the sharded masters in the swap file and steps them a sub-group at
  // a time (Note [Offloaded optimizer state] in parallel/offload/swapped_optimizer_state.h):
  // from now on the step rounds each chunk with round_chunk() while it is in memory, and
  // after_step() only gathers.
  void round_chunks_in_step();
  bool rounds_in_step() const override { return chunks_rounded_in_step_; }
  // Rounds this rank's chunk of `block` into the 16-bit model buffer (sharded masters).
  void round_chunk(int64_t block, const Tensor& staging) override;
  // The f16 loss scaler (null for f32 and bf16).
  optim::LossScaler* scaler() const { return scaler_.get(); }
  // Sharded masters only: after_step() starts its gathers through `async` and `model` waits
  // for them module by module (Note [Gathers after the step]). `async` and `model` must
  // outlive this store.
  void gather_in_background(AsyncCollectives* async, Module& model);
  void settle() override;

 private:
  class ForwardWaits;  // the model's hooks: waits for a module's blocks
  // Waits for the gathers of the blocks holding `m`'s own parameters.
  void settle_module(const Module& m);
  // all_gather(in, out) of one block after the step: started through async_, or blocking.
  void gather_block(int64_t block, const Tensor& in, const Tensor& out);
  // The blocks in the order after_step() gathers them: the agreed order once fixed, else
  // those this rank's forwards needed (none without async_), in order of first need, then
  // the others.
  std::vector<int64_t> gather_order() const;
  // Fixes gather_order_ as rank 0 recorded it, broadcast over the group (idle at the step):
  // every rank gathers in one order whatever forwards only some of them ran.
  void agree_gather_order();
  // after_step(), the masters rounded into the model here unless `rounded` already.
  void finish_step(bool rounded);
  // round_into_model(), the rounding left out where `rounded` already.
  void update_model(bool rounded);

  Communicator& dp_;
  const FlatLayout& layout_;
  std::vector<Tensor>& params_;
  bool sharded_;
  Tensor flat_params_;  // (layout.numel) f32: the parameters, or their masters at stage 0
  // Per block, (chunk) f32 masters of this rank's chunk, each a storage of its own (so that
  // NVMe offload can swap them a sub-group at a time); 16-bit parameters at stages 1-2 only.
  std::vector<Tensor> master_chunks_;
  Device device_;
  bool chunks_rounded_in_step_ = false;
  Tensor flat_model_;                          // (layout.numel) f16/bf16 model weights; mixed only
  std::vector<Tensor> masters_;                // f32 views of flat_params_; mixed stage 0 only
  std::unique_ptr<optim::LossScaler> scaler_;  // f16 only
  // Note [Gathers after the step]: set by gather_in_background().
  AsyncCollectives* async_ = nullptr;
  Module* model_ = nullptr;
  std::shared_ptr<ModuleHooks> hooks_;  // ForwardWaits, installed on model_
  std::vector<CommHandle> gathering_;   // per block, since the step
  std::vector<int64_t> first_needed_;   // blocks in the order module calls first needed them
  std::vector<int64_t> gather_order_;   // fixed at the first step
  std::unordered_map<const void*, int64_t> block_of_;  // a parameter's impl: its block
  std::unordered_map<const Module*, std::vector<int64_t>> module_blocks_;  // cached
};

// Where stage 3's shards go when a run offloads them; each swapper must outlive the store.
struct ShardOffload {
  // Each f32 master chunk a storage of its own in this swap file, written as soon as it is
  // made (Note [ZeRO's offloaded state] in parallel/zero/zero_offload.h); the step rounds it.
  TensorSwapper* masters = nullptr;
  // The 16-bit shard in this swap file (Note [Offloaded parameters] in partitioned_params.h).
  TensorSwapper* chunks = nullptr;
  // The f32 masters, and the 16-bit shard, in host memory on a GPU run (Note [Offload on a
  // GPU] in zero_optimizer.h); the step rounds host masters into the 16-bit shard.
  bool host_masters = false;
  bool host_chunks = false;
  bool pin_chunks = false;  // host_chunks in pinned memory
};

class PartitionedWeights final : public ParameterStore {
 public:
  // Partitions `params` (on one device, flat order of `layout`, one block per parameter)
  // and installs the gathering hooks on `model`; the destructor removes them. `layout` and
  // `model` must outlive this. `init` fills the parameters that are not materialized.
  // `offload` places the shards (16-bit parameters only, but for nothing offloaded).
  PartitionedWeights(Communicator& dp, const FlatLayout& layout, const std::vector<Tensor>& params,
                     Module& model, const ZeroConfig& config, const ParameterInit& init,
                     const ShardOffload& offload = {});
  ~PartitionedWeights() override;

  Tensor own_chunk(int64_t block) const override;
  void after_step() override { partitioned_->after_step(); }
  std::vector<Tensor> whole() override { return partitioned_->gather_all(); }
  void load(const std::vector<Tensor>& whole) override { partitioned_->load(whole); }
  int64_t bytes() const override;
  void begin_backward() override { partitioned_->begin_backward(); }
  void grad_ready(int64_t param) override { partitioned_->grad_ready(param); }
  void end_backward() override { partitioned_->end_backward(); }

  bool sharded_parameters() const override { return true; }
  // Per block, the swapper id of its master chunk; empty without a swapper.
  const std::vector<int64_t>& swap_ids() const { return swap_ids_; }
  bool rounds_in_step() const override { return partitioned_->rounds_in_step(); }
  // Rounds block `block`'s master chunk into the 16-bit shard (with a swapper, in the step).
  void round_chunk(int64_t block, const Tensor& staging) override {
    partitioned_->round_chunk(block, staging);
  }
  const PartitionedParams& partitioned() const { return *partitioned_; }
  // Gathers through `async` from now on (PartitionedParams::set_async).
  void set_async(AsyncCollectives* async) { partitioned_->set_async(async); }
  // Waits for every travelling gather (PartitionedParams::settle_all).
  void settle() override { partitioned_->settle_all(); }

 private:
  const FlatLayout& layout_;
  Module& model_;
  Tensor shard_;                // (layout.shard_numel()) f32, unless swapped
  std::vector<Tensor> chunks_;  // per block, (chunk) f32: views of shard_, or own storages
  std::vector<int64_t> swap_ids_;
  std::shared_ptr<PartitionedParams> partitioned_;  // the model's hooks
};

}  // namespace tessera::parallel
