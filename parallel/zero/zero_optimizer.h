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
// A ZeroOptimizer is a facade over two parts chosen at construction: a ParameterStore
// (parameter_store.h: MasterWeights for stages 0-2, PartitionedWeights for 3) and a
// GradientReducer (gradient_reducer.h: AllReduceGradients, ReduceScatterGradients,
// BucketedGradients for 2-3); the sharded state's save, load and reshard are in
// zero_state.h. With overlap_comm, stages 0 and 1 also reduce from the hooks, on the
// boundary micro-batch, and each reduction travels on a worker thread while backward
// computes the next blocks (Note [Overlapped reductions] in gradient_reducer.h), finished
// before backward() returns; at stages 1-2 the parameters' gathers after the step travel
// during the next forward (Note [Gathers after the step] in parameter_store.h); at stage 3
// the parameters' gathers and prefetches go through the same worker (Note [ZeRO-3
// parameters] in partitioned_params.h). That holds where the backend runs on any thread
// (thread ranks, MPI with MPI_THREAD_MULTIPLE) and on NCCL, which queues them on its
// stream (Note [Device-queued operations] in parallel/comm/communicator.h); host staging
// blocks.
//
// Note [Mixed precision]
// With MixedPrecision::dtype f16 or bf16 (DeepSpeed's fp16 / bf16 sections) the model's
// parameters are views of a flat 16-bit buffer, and the optimizer steps f32 master weights
// with f32 gradients, so its state, norms and step are f32 as in DeepSpeed. Per stage, with
// W ranks, the bytes per parameter a rank holds (Adam; configs/README.md has the table):
//   0  whole f32 masters; backward accumulates into a flat 16-bit gradient buffer, averaged
//      block by block into a flat f32 one: 2 + 2 + 4 + 12 = 20
//   1  the f32 masters of this rank's chunks only; the 16-bit buffer's blocks are
//      reduce-scattered into an f32 gradient shard: 2 + 2 + (4 + 12) / W
//   2  as 1, with no 16-bit buffer: each block's gradients are reduced as backward
//      completes them and added into the f32 shard: 2 + (4 + 12) / W
//   3  as 2, and the parameters are a 16-bit shard too (Note [ZeRO-3 parameters]):
//      (2 + 4 + 12) / W
// After the step each rank rounds its masters' chunks into the model's buffer and the
// chunks are all-gathered in 16 bits (stage 3: into its 16-bit shard, gathered when
// used). DeepSpeed's stage 1-2 optimizer (deepspeed/runtime/zero/stage_1_and_2.py) holds
// the same buffers, plus a 16-bit gradient partition at stage 2 (its estimator's
// 2 + 18 / W); its stage 3 estimate is 18 / W.
// Gradients are reduced in MixedPrecision::communication_dtype() (DeepSpeed's
// communication_data_type, default the parameters' dtype): 16-bit values are divided by W
// before the reduction and summed with f32 arithmetic (Note [16-bit reductions] in
// parallel/comm/communicator.h; NCCL sums in 16 bits), f32 ones averaged after it.
// Over a step's micro-batches, stages 0-1 accumulate in accumulation_dtype(): bf16 in f32
// by default (DeepSpeed's BF16_Optimizer): each micro-batch that does not reduce adds the
// 16-bit buffer into a flat f32 sum, made at the first such micro-batch, and clears it;
// f16 in f16, as DeepSpeed does. Pipeline stages sum in the parameters' dtype: the tied
// embedding's copies are summed in the model's gradients before the reduction (an explicit
// f32 accumulation is a config error there). Stages 2-3 add every micro-batch into the f32
// shard.
// With f16 the loss is multiplied by the loss scale before backward;
// clip_grad_norm() detects inf/nan in the scaled gradients (overflow) and otherwise unscales
// and clips in one multiply (DeepSpeed's unscale_and_clip_grads); step() updates the scaler
// and skips the step on overflow. Checkpoints hold the f32 masters: whole at stage 0, each
// rank's shard at stages 1-3 (shard_pieces()).
//
// Reductions are sums in rank order and averaging is one multiply, so all ranks hold
// bitwise identical gradients, norms and parameters. Against one process with the same
// global batch, results differ only by summation order.
//
// Note [1-bit optimizers under ZeRO stage 0]
// OneBitAdam, ZeroOneAdam and OneBitLamb (parallel/compression/onebit_optimizer.h) run at
// stage 0 only, as in DeepSpeed. Before each step the optimizer says whether it wants the
// gradients averaged in f32 (warm-up, variance steps); otherwise the boundary's reduction
// is skipped and it reads each rank's local gradient (the micro-batch mean, as always) and
// communicates in 1 bit itself. clip_grad_norm() then clips each rank's local gradient by
// its local norm (DeepSpeed's behaviour), and with f16 the ranks agree on an overflow
// through one max all-reduce, so that they all skip the same steps.
//
// Note [ZeRO under model parallelism]
// With tensor slicing or a pipeline, each rank's optimizer covers the parameters its model
// holds, and `dp` is its data-parallel group (the ranks holding the same slice). A
// pipeline stage backpropagates each micro-batch with backward_unreduced(); after the last
// one the tied embedding's copies are summed over their stages, then reduce_gradients()
// averages over dp (DeepSpeed's ReduceTiedGrads, then ReduceGrads). Stage 2 reduces during
// backward, before the tied sum could happen, so pipelines take stages 0-1, as in DeepSpeed.
// The global gradient norm adds each replica's squares over the model-parallel group
// (set_model_parallel_norm), counting replicated and tied copies once.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/module.h"
#include "autograd/streamed_state.h"
#include "core/tensor.h"
#include "optim/config.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/communicator.h"
#include "parallel/compression/onebit_optimizer.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/gradient_reducer.h"
#include "parallel/zero/mixed_precision.h"
#include "parallel/zero/parameter_store.h"
#include "parallel/zero/partitioned_params.h"
#include "parallel/zero/zero_config.h"
#include "parallel/zero/zero_offload.h"
#include "parallel/zero/zero_state.h"

namespace tessera::parallel {

// Note [Offload on a GPU]
// With offload_optimizer "cpu" or "nvme" on a CUDA run (stages 1-3, 16-bit parameters:
// DeepSpeed's ZeRO-Offload) the optimizer steps in host memory, as deepspeed/runtime/zero/
// stage_1_and_2.py and stage3.py do with offload_optimizer: each block's f32 master chunk
// lives on the host (MasterWeights' and PartitionedWeights' host_masters; in the swap file
// between steps with "nvme", Note [ZeRO's offloaded state]), and so does the optimizer's
// state, made by the host optimizer (Tessera's CPU Adam). The gradients are reduced, clipped and
// unscaled on the device as without offload; before a block's update the step copies its averaged
// f32 chunk to the host (prepare_gradient; host memory that the update's end lets go, kept
// pinned for the next step with pin_memory), and after it
// rounds the master into the device's 16-bit chunk (round_chunk: converted on the host, two bytes
// an element across), which after_step() all-gathers on the device (stages 1-2) or stage 3's
// gathers read. So the GPU holds the 16-bit parameters (all of them at stages 1-2, a shard
// at 3) and the f32 gradient shard (2 + 4/N bytes a parameter at stage 2 and N ranks, where
// in-memory ZeRO-2 holds 2 + 16/N), and the step's arithmetic is the CPU's, not bitwise the
// CUDA optimizer's. A CPU run with "cpu" and 16-bit parameters takes the same path (its
// copies within one memory, the in-memory run's bits), which is how the CPU tests cover it.
// offload_param on a GPU keeps stage 3's 16-bit shard on the host too (Note [Offloaded
// parameters] in partitioned_params.h). pin_memory (of either) puts "cpu"'s host memory
// in pinned pages, for faster copies, and then the step goes by sub-groups (sub_group_size)
// with each one's gradient copies queued on the device while the host updates the one
// before, and its rounded 16-bit values, written into those gradients' pinned copies once
// read, queued to the device while the host updates the one after (host_step,
// round_chunk with staging). Not yet: f32 parameters on a GPU, the gradients moved to the host
// during backward (DeepSpeed's, which frees the 4/N), and any overlap with "nvme" (whose
// copies wait, each in turn).

// Note [Expert parameters]
// Under expert parallelism (parallel/expert/expert_groups.h) each rank of a data group of D
// ranks holds E / P of every MoE layer's experts, and the D / P ranks that hold the same
// ones form its expert-data group. The optimizer then has two parts, as DeepSpeed's MoE
// parameter groups (split_params_into_different_moe_groups_for_optimizer in
// deepspeed/moe/utils.py): the other parameters over the data group as above, and the
// experts' in a second ZeroOptimizer (experts()) over the expert-data group, with the same
// stage, precision and optimizer. At stage 3 (which DeepSpeed refuses for MoE) each expert
// is partitioned over its expert-data group and gathered by the expert part's own module
// hooks on the experts (ExpertParameters::modules); every rank runs each of its experts in
// every forward, on its whole capacity buffer, so the ranks of a group gather alike. An expert's
// gradients are summed over its expert-data group and divided by D, not D / P: its backward has
// already summed what its expert group's P ranks sent it (the all-to-all's backward), so the sum
// covers all D ranks' micro-batches, and D gives the mean over them that the other parameters take
// and one process takes, whatever ep_size is. The two parts act as one optimizer: one backward pass
// fills both (each reducing over its own group), the gradient norm adds both parts' squares (every
// element once) in one all-reduce over the data group, one clip coefficient and one f16 overflow
// decision apply to both, and they step together under this part's loss scale. Checkpoints
// save and load each part on its own (the engine: Note [Expert checkpoints] in
// parallel/engine/engine.h). Not with the 1-bit optimizers, offload, or model parallelism
// (refused).
struct ExpertParameters {
  Communicator* group = nullptr;          // the expert-data group; null: no expert part
  std::vector<optim::ParamGroup> params;  // the experts' parameters, as decay groups
  // A module tree holding the experts and no other parameters, on which the expert part
  // installs its module hooks (stage 3, and overlap_comm's gathers at stages 1-2) in place
  // of the data part's. It must outlive the optimizer.
  Module* modules = nullptr;
};

// Bytes of model state one rank holds (the buffers the optimizer owns).
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
  int64_t total() const { return params + grads + optimizer; }
  // Not in memory: what the NVMe swap files hold (offload_optimizer): the optimizer state
  // and masters, and from backward to the step the gradients at stages 2-3.
  int64_t on_nvme = 0;
  // In host memory apart from the model's device (Note [Offload on a GPU]): the f32 masters,
  // the optimizer state and the gradients' host copies of a run that steps on the host
  // (offload_optimizer; "cpu" on a CPU run too), and a GPU run's 16-bit shard with
  // offload_param; not in params, grads or optimizer.
  int64_t on_host = 0;
};

class ZeroOptimizer {
 public:
  // `groups` as optim::decay_groups(model) makes them; every parameter must be a
  // contiguous tensor of precision.dtype that requires grad, all on one device (the CPU or
  // a GPU, at every stage). LAMB with stage >= 1 is refused. Stage 3
  // installs its hooks on `model`; parameters must be read inside a ModuleCall of their
  // module: a Layer's call operator opens one (autograd/module.h). The destructor removes the
  // hooks; a stage 3 model's partitioned parameters then hold no values (take whole_parameters()
  // before).
  // At stage 3 parameters may be unmaterialized (Note [Partitioned construction] in
  // autograd/module.h): `init` then gives each its values. With `experts`, the experts'
  // parameters (not in `groups`) go to the expert part (Note [Expert parameters]), whose
  // group's size must divide dp's.
  ZeroOptimizer(Communicator& dp, Module& model, std::vector<optim::ParamGroup> groups,
                const optim::OptimizerConfig& optimizer, const ZeroConfig& zero,
                const MixedPrecision& precision = {}, const ParameterInit& init = {},
                const ExpertParameters& experts = {});
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Starts an optimizer step: the gradients of the previous one are discarded.
  void zero_grad();
  // backward(loss, scale) for one micro-batch (times the loss scale with f16); `boundary`
  // marks the last micro-batch of the step, after which every gradient has been reduced.
  void backward(const Tensor& loss, double scale, bool boundary);
  // For a pipeline stage (Note [ZeRO under model parallelism]): backward from `root` with no
  // reduction; reduce_gradients() follows the last micro-batch, after the tied copies'
  // gradients are summed. The last stage's root is the loss, seeded with `grad` times the
  // loss scale (`loss` true); an earlier stage's is its output, seeded with the gradient
  // the next stage sent, which carries the loss scale already. A defined `extra` (a scalar
  // loss term of an earlier stage) is backpropagated in the same pass from `loss_seed`
  // times the loss scale. Stages 0-1 only.
  void backward_unreduced(const Tensor& root, const Tensor& grad, bool loss,
                          const Tensor& extra = Tensor(), const Tensor& loss_seed = Tensor());
  // Averages every gradient over the data-parallel group (the expert part's over its own
  // group: Note [Expert parameters]), as the boundary backward does. Stages 0-1 only.
  void reduce_gradients();
  // Model parallelism: clip_grad_norm() sums the squared gradients over `group` (every rank
  // of one model replica: DeepSpeed's model-parallel group), leaving out the parameters
  // named in `duplicates` (copies that another rank of `group` counts: replicated
  // parameters on tensor-parallel ranks > 0, the tied head's wte). `group` must outlive
  // this optimizer.
  void set_model_parallel_norm(Communicator& group, std::set<std::string> duplicates);
  // The L2 norm of the averaged (unscaled) gradient over all parameters, each element
  // counted once; when max_norm > 0 and max_norm / (norm + 1e-6) < 1 the gradients are
  // scaled by that, as optim::clip_grad_norm does. With f16 it also unscales them, or finds
  // an overflow (the norm is then inf or nan). Call once after the boundary's backward.
  double clip_grad_norm(double max_norm);
  // Note [One-pass mixed-precision step]
  // prepare_step(max_norm) + step() is clip_grad_norm(max_norm) + step() with one host read
  // per step, where the inner optimizer takes scaled steps (Adam, AdamW: Note [Scaled steps]
  // in optim/optimizer.h) at stages 0-2 without offload or experts (one_pass_step()): the
  // squared norm is summed and all-reduced on the gradients' device, the unscale-and-clip
  // factor computed there (Note [Clip factor] in kernels/clip_factor.h), and the optimizer's
  // pass takes it and rounds each updated master into the 16-bit model (legacy Apex
  // FusedAdam's `scale` and `output_params`). An f16 overflow's factor is NaN and the pass
  // changes nothing; step() then reads the norm (the one read, after the update is queued)
  // and lowers the loss scale. The gradients keep backward's (loss-scaled, unclipped)
  // values. The result equals the separate passes bit for bit; elsewhere prepare_step()
  // is clip_grad_norm() and step() the separate passes.
  void prepare_step(double max_norm);
  // The norm clip_grad_norm() returned, or the one prepare_step() + step() found; whether
  // step() updates in one pass (see the note).
  double grad_norm() const { return grad_norm_; }
  bool one_pass_step() const;
  // The optimizer step on this rank's shard; then the parameters are all-gathered. Returns
  // false when an f16 overflow skipped the step (the loss scale was lowered instead). At
  // stages 1-2 with overlap_comm the gathers travel on after it returns (Note [Gathers
  // after the step] in parameter_store.h): a forward through the model waits for them
  // module by module; before reading the parameters any other way, or using the data
  // group directly, call wait_for_parameters().
  bool step();
  // With NVMe offload (Note [ZeRO's offloaded state]): sends the masters that
  // whole_parameters() or load_parameters() brought into memory back to the swap file. Call
  // once the checkpoint is written; a no-op otherwise.
  void swap_out_offloaded() {
    if (offload_) offload_->swap_out_resident();
  }
  // Waits for every operation this optimizer (both parts) still has travelling on its groups:
  // the parameters are then current, and the groups free for direct use.
  void wait_for_parameters() const { settle_communication(); }
  // The f16 loss scaler (null for f32 and bf16).
  const optim::LossScaler* loss_scaler() const { return scaler_; }
  optim::LossScaler* loss_scaler() { return scaler_; }
  DType precision() const { return precision_.dtype; }

  void set_lr(double lr);
  double lr() const;
  // Forwards to Optimizer::set_momentum.
  bool set_momentum(double beta1);
  int64_t step_count() const;

  int stage() const { return config_.stage; }
  // The expert part (Note [Expert parameters]), or null. Backward, clipping, the step,
  // zero_grad, set_lr, set_momentum, wait_for_parameters and model_state_bytes cover both
  // parts; everything else (the layout, the group, the state saved and loaded, the
  // parameters whole, the stage-3 parameters, the reductions' peak) this part only: the
  // engine takes the expert part's through this. The expert part's own loss scaler is
  // unused: this part's scales both.
  ZeroOptimizer* experts() { return experts_.get(); }
  const ZeroOptimizer* experts() const { return experts_.get(); }
  const FlatLayout& layout() const { return layout_; }
  Communicator& comm() const { return dp_; }
  ModelStateBytes model_state_bytes() const;
  // With overlap_comm: the most gradient reductions, and elements of their buffers, that
  // travelled at once (Note [Overlapped reductions] in gradient_reducer.h).
  GradientReducer::InFlightPeak peak_reductions_in_flight() const {
    return gradients_->peak_in_flight();
  }

  // Whether state_dict() is this rank's shard (stages 1-3) rather than the whole state.
  bool sharded() const { return config_.stage >= 1; }
  // Stage 0: the optimizer's state_dict() ("step", "<kind>.<parameter name>"), the live
  // buffers. Stages 1-3: this rank's shard: "step" and one tensor of layout().shard_numel()
  // elements per kind ("exp_avg", ...), copied (materialize(shard_pieces(false))).
  StateDict state_dict() const;

  // Note [Streamed checkpoints]
  // A rank's shard is written and read a chunk at a time, so that NVMe-offloaded state
  // (Note [ZeRO's offloaded state]) is never in memory whole. shard_pieces() produces each
  // kind's shard from its block chunks in order as a writer asks for them: those in the
  // swap file are read in one at a time, the next one's read started ahead, and let go
  // unwritten (TensorSwapper::read_each). load_shard() takes a shard that a run of the same
  // layout saved the way a step goes, a sub-group at a time (ZeroOffload::load): the
  // masters written (not read), the state made, the chunks rounded into the 16-bit
  // parameters and swapped out; a mapped file (Note [Mapped tensors] in
  // models/io/safetensors.h) is read as the chunks want it. Besides the swapper's buffers
  // one chunk (saving) or one sub-group (loading) is in memory. Without offload the same
  // functions copy no whole shard either. Another layout (a resumed run of another world
  // size) loads through whole_state (load_whole_state()), which brings this rank's part of
  // the state into memory at once.

  // Stages 1-3: this rank's shard as state_dict() has it, then (`with_parameters` and
  // shards_parameters()) the f32 parameter shard as kParameterShard ("param"), each
  // produced a chunk at a time (Note [Streamed checkpoints]). The pieces read this
  // optimizer as it is when they are produced: write them before the next step or load.
  StreamedStateDict shard_pieces(bool with_parameters) const;
  // Loads a shard that shard_pieces() of a run with this layout() wrote, everything checked
  // before anything changes: the state, and with a parameter shard (only where
  // shards_parameters()) the parameters; without one they stay as load_parameters() left
  // them. Collective: every rank's parameters take the new values.
  void load_shard(const StateDict& shard);
  // Throws what load_shard(shard) would find wrong with `shard`, changing nothing.
  void check_shard(const StateDict& shard) const;
  // The whole per-parameter state ("step", "<kind>.<parameter name>") on every rank:
  // stage 0's state_dict(), or the shards all-gathered over the data-parallel group and
  // unsharded (collective at stages 1-3).
  StateDict whole_state_dict() const;
  // Every trainable parameter of this part whole in f32 (name -> tensor, flat order). Collective
  // where shards_parameters(): stage 3, where the parameters are gathered one at a time into new
  // tensors, and f16/bf16 at stages 1-2, whose f32 masters are gathered into host tensors;
  // the f32 master weights with f16/bf16 at stage 0; the model's own tensors otherwise.
  StateDict whole_parameters();
  // Whether the f32 parameters are sharded over dp: stage 3, and the f32 masters of 16-bit
  // parameters at stages 1-2. A checkpoint then saves them in each rank's shard.
  bool shards_parameters() const;
  // Sets every parameter (and f32 master) from whole f32 tensors (name -> tensor, like
  // Module::state_dict(); exactly the trainable parameters), all checked before any
  // changes. Needed at stage 3 and with f16/bf16; f32 stages 0-2 may also load the model.
  void load_parameters(const StateDict& whole);
  // The stage 3 parameters (null for other stages).
  const PartitionedParams* partitioned() const;
  // The 1-bit optimizer this stage-0 optimizer steps with (Note [1-bit optimizers under
  // ZeRO stage 0]), or null.
  const OneBitOptimizer* onebit() const { return onebit_; }
  // The state that differs between the ranks of dp (the 1-bit optimizers' error buffers
  // and local values; empty for the others): saved per rank, restored only at the same
  // world size with load_rank_state(), else started afresh with reset_rank_state().
  StateDict rank_state() const;
  void load_rank_state(const StateDict& saved);
  void reset_rank_state();
  // Loads whole per-parameter state (stage 0's state_dict(), or whole_state() of the shards
  // of any world size), keeping this rank's part. Everything is checked before anything
  // changes.
  void load_whole_state(const StateDict& whole);

 private:
  // The expert part's constructor: `mean_over` is the data group's size (Note [Expert
  // parameters]).
  ZeroOptimizer(Communicator& dp, Module& model, std::vector<optim::ParamGroup> groups,
                const optim::OptimizerConfig& optimizer, const ZeroConfig& zero,
                const MixedPrecision& precision, const ParameterInit& init,
                const ExpertParameters& experts, int mean_over);
  // Makes experts_ (zero_experts.cc), checking what the two parts need.
  void make_expert_part(const ExpertParameters& experts, const optim::OptimizerConfig& optimizer,
                        const ParameterInit& init);
  // backward()'s parts around the autograd pass (both parts' run each): before it; after
  // it, reducing what the hooks left; and after a failed pass, dropping what it collected.
  void begin_backward(bool boundary);
  void end_backward();
  void abort_backward() noexcept;
  // The squared norm of the averaged gradients with the expert part's added, over the data
  // group (Note [Expert parameters]); collective over it.
  Tensor squared_norm_with_experts();
  // step() once the loss scale allows it: the inner optimizer's update, then the gathers.
  void apply_step();
  // Settles the groups; the step's {factor, norm} on device_ (kernels::clip_factor) from the
  // squared norm summed over the groups sharing the gradients, with no host read.
  Tensor clip_factor(double max_norm);
  // Reads clip_factor()'s result into grad_norm_ and overflow_ (with local 1-bit gradients,
  // the ranks agree on an overflow); returns the factor.
  double read_clip(const Tensor& factor);
  bool step_in_one_pass();  // step() in one pass (the note, zero_one_pass.cc)
  // Per name of an inner_ parameter, the 16-bit tensor it is rounded into (empty at f32).
  std::unordered_map<std::string, Tensor> model_copies() const;
  // Finishes whatever async_ still carries (a forward without its backward leaves prefetched
  // gathers; a step leaves its parameters' gathers at stages 1-2) before this object uses
  // the group itself. Const: it changes no value, only waits for those already decided.
  void settle_communication() const;
  // inner_ for `config`, which may be a 1-bit optimizer over dp_ (then also onebit_).
  std::unique_ptr<optim::Optimizer> make_inner(const optim::OptimizerConfig& config,
                                               std::vector<optim::ParamGroup> groups);
  // Whether this step's gradients are averaged over dp in f32 (always, except when a 1-bit
  // optimizer takes local gradients).
  bool full_precision_reduction() const;
  void on_grad_ready(int64_t param);
  void reduce_block(int64_t block);
  // Makes swapper_ where offload_optimizer puts the state on NVMe (stages 1-3), and
  // param_swapper_ where offload_param puts stage 3's 16-bit shard there, before the parts
  // that swap their storages; refuses offloading a GPU run.
  void make_swapper();
  // Sets up offload_ (after inner_ is made).
  void start_offload();
  // Before the optimizer reads block `block`'s gradient: its pending scales applied and,
  // with host_steps_, the device's chunk copied into host memory.
  void prepare_gradient(int64_t block);
  // Block `block`'s host gradient copy (host_grads_), its memory allocated where it has none.
  const Tensor& host_gradient(int64_t block);
  // After block `block`'s update: its host gradient copy's memory goes (kept when pinned_).
  void release_host_gradient(int64_t block);
  // The step without a swap file in host memory (Note [Offload on a GPU]): with pinned_,
  // sub-group by sub-group, the next one's gradients copied while this one updates.
  void host_step();
  // Moves the host masters into pinned memory (pinned_), values kept.
  void pin_host_masters();
  // Brings offloaded masters into memory before they are read or written whole, otherwise
  // than by the step or a streamed checkpoint (Note [Offloaded optimizer state]).
  void make_masters_resident() const;
  // A shard (load_shard()'s form) checked, as the inner optimizer's chunk state and the
  // parameter shard (undefined where there is none).
  struct ShardParts {
    StateDict chunks;
    Tensor params;
  };
  ShardParts shard_parts(const StateDict& shard) const;
  // The piece producer of a shard tensor `name` made of one chunk per block, tensors[b]
  // (swapper ids in `ids`, -1 where not swapped): Note [Streamed checkpoints].
  StreamedTensor chunked_shard(std::string name, std::vector<Tensor> chunks,
                               std::vector<int64_t> ids) const;

  Communicator& dp_;
  Module& model_;
  ZeroConfig config_;
  MixedPrecision precision_;
  Device device_;  // of every parameter and buffer
  std::vector<optim::ParamGroup> groups_;
  std::vector<Tensor> params_;  // flat order
  FlatLayout layout_;
  // The swap files of NVMe offload (Note [ZeRO's offloaded state], Note [Offloaded
  // parameters] in partitioned_params.h), or null; before the parts whose storages they
  // hold, so that they outlive them.
  std::unique_ptr<TensorSwapper> swapper_;
  std::unique_ptr<TensorSwapper> param_swapper_;
  // The parts (Note [ZeRO stages]): where the parameters live and how the gradients are
  // reduced, chosen at construction.
  std::unique_ptr<ParameterStore> weights_;
  MasterWeights* master_ = nullptr;            // weights_ at stages 0-2
  PartitionedWeights* partitioned_ = nullptr;  // weights_ at stage 3
  optim::LossScaler* scaler_ = nullptr;        // master_'s, f16 only
  // Runs gradients_' reductions and stage 3's gathers with overlap_comm (null otherwise).
  std::unique_ptr<AsyncCollectives> async_;
  std::unique_ptr<GradientReducer> gradients_;
  bool overflow_ = false;                                 // found by clip_grad_norm
  double grad_norm_ = 0.0;                                // grad_norm()
  Tensor pending_factor_;                                 // prepare_step()'s, for a one-pass step()
  std::unordered_map<std::string, Tensor> model_copies_;  // model_copies(), made once
  std::unique_ptr<optim::Optimizer> inner_;  // over the parameters (0) or the chunks (1-3)
  OneBitOptimizer* onebit_ = nullptr;        // inner_ when it is a 1-bit optimizer
  std::unique_ptr<ZeroOffload> offload_;     // inner_'s state in NVMe swap files, or null
  // Note [Offload on a GPU]: inner_ steps host masters from host copies of the gradients
  // (host_grads_, per block, memory only during the step; kept when pinned_).
  bool host_steps_ = false;
  std::vector<Tensor> host_grads_;
  bool pinned_ = false;  // offload_optimizer.pin_memory with "cpu": both in pinned memory
  // host_step()'s sub-groups of blocks and their chunks' names (pinned), made at its first step.
  std::vector<std::vector<int64_t>> host_groups_;
  std::vector<std::set<std::string>> host_group_names_;
  // offload_param on a GPU: the 16-bit shard in host memory or the swap file, copied to the
  // device for each gather (Note [Offloaded parameters] in partitioned_params.h).
  bool host_chunks_ = false;
  std::vector<int64_t> pending_;  // per block: parameters whose hook has not run
  std::vector<bool> reduced_;     // per block, in the current micro-batch
  bool reducing_ = false;         // whether this micro-batch reduces
  bool in_backward_ = false;
  Communicator* norm_group_ = nullptr;  // the model-parallel group of the norm, if any
  std::vector<bool> counted_;           // per parameter: counted in the norm (empty: all)
  int mean_over_ = 0;                   // the expert part's averaging (Note [Expert parameters])
  // The expert part (Note [Expert parameters]); last, so that it goes first.
  std::unique_ptr<ZeroOptimizer> experts_;
};

}  // namespace tessera::parallel
