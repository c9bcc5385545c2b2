// Engine: one training step of any parallel layout, the way deepspeed.initialize returns
// an engine (deepspeed/runtime/engine.py, and deepspeed/runtime/pipe/engine.py for
// pipelines). It owns the optimizer with ZeRO and mixed precision, the learning-rate
// schedule, gradient clipping and loss scaling, and with a pipeline the executor and the
// tied-weight reduction; the caller brings the model, the groups and the micro-batches.
//
//   Engine engine(config.engine, model, optim::decay_groups(...), device, data_group, &groups);
//   for each step:
//     const StepStats s = engine.train_batch(micro_batches);  // gradient_accumulation_steps
//   const double val = engine.eval_batch(val_batches);
//   EngineCheckpoint c = engine.save_state();  ...  engine.load_state(loaded, counters);
//
// Note [Engine]
// Flow: config -> Engine -> TrainableModel (models/) -> ops (autograd/) -> kernels. A step:
// the optimizer takes the schedule's rate (and momentum), the gradients are zeroed, the
// dropout streams are keyed for the step (Note [Dropout per step]), then
//   - without a pipeline, each micro-batch runs forward, loss and backward through
//     ZeroOptimizer (which reduces at the last one, or during backward at stages 2-3);
//   - with one, the executor runs the 1F1B schedule over ModelStage, backward unreduced,
//     and its closing instructions call the engine's hooks: the tied copies are summed
//     (DeepSpeed's ReduceTiedGrads), the gradients averaged over the data group
//     (ReduceGrads), and the optimizer steps (OptimizerStep);
// the step clips the gradients (unscaled, or an f16 overflow found), steps the optimizer
// (or skips on overflow) and moves the schedule. The loss is the mean over micro-batches
// and data-parallel ranks, equal on every rank.
//
// Note [Data-parallel engine]
// Every rank of the data group holds the same model and trains on its own micro-batches;
// ZeroOptimizer (stages 0-3) reduces gradients and steps. Checkpoints save whole tensors
// (stage 0 on data rank 0) or each rank's shard (stages 1-3, with the parameter shard at
// stage 3), and any world size and stage resumes any other: optimizer state is resharded
// through whole per-parameter tensors (parallel/zero/zero_state.h, whole_state()).
//
// Note [3D engine]
// With `groups` (a pipeline or tensor slicing: Note [3D grid] in parallel/topology.h) each
// rank holds its stage's part of the model as slices over its model group, ZeroOptimizer
// (stages 0-1 with a pipeline, 0-2 with slicing alone) shards over its data group, and the
// gradient norm adds up over the replica's pipe x model group, counting replicated and tied
// copies once (replica_duplicates in parallel/engine/model_stage.h).
//
// Note [3D checkpoints]
// A pipeline or tensor-parallel run saves whole tensors: each rank gathers its optimizer
// state over its data group and both weights and state over its model group; the data-0,
// model-0 rank of each stage writes its part (EngineCheckpoint::part). Loading merges the
// parts into one whole checkpoint, which any layout (P, T, data) and ZeRO stage 0-2 slices
// to what it holds (parallel/engine/model_parallel_state.h): resuming at the same layout is
// exact, and tools/generate and zero_to_fp32 read the same files.
//
// Note [Expert checkpoints]
// Under expert parallelism (Note [Expert parameters] in parallel/zero/zero_optimizer.h) the
// experts' state is saved apart from the rest, whole: each expert-data group gathers its
// experts' weights and optimizer state (global names, "transformer.h.1.mlp.experts.5.*"),
// and its rank 0, whose data rank is its expert-parallel rank e, writes them as expert
// part e (DeepSpeed writes its experts' optimizer state per expert-parallel rank too,
// expp_rank_<e>_mp_rank_00_optim_states.pt, and their weights per expert). The other
// parameters are saved as without experts. Loading, every rank checks and maps every part
// (copying only what it takes) and takes its own experts by name; a checkpoint without
// expert parts (ep_size 1) has the experts among the other weights and state, and a run
// without an expert part takes the experts' parts with the rest, so any ep_size and world
// size resumes any other.
//
// Note [Dropout per step]
// The dropout streams are derived, not saved: at step s each draws from the Philox key
// hash(k, s), k being the stream's own key (a pipeline stage's differs from stage 0's, a
// tensor-parallel rank's sliced stream from its peers': Note [Model-parallel dropout] in
// parallel/tensor/dropout_streams.h), at offset 0. A saved offset would be wrong for every rank
// that draws a different amount than the one that wrote it (each pipeline stage does); a derived
// key needs nothing per rank, so a resumed step draws the masks the uninterrupted one drew.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/comm/communicator.h"
#include "parallel/engine/trainable_model.h"
#include "parallel/engine_config.h"
#include "parallel/pipeline/executor.h"
#include "parallel/topology.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::parallel {

// What one training step did.
struct StepStats {
  double loss = 0;       // mean over micro-batches and data-parallel ranks
  double grad_norm = 0;  // of the averaged, unscaled gradient (inf or nan on f16 overflow)
  double lr = 0;         // the rate the step used
  double next_lr = 0;    // the rate the next step will use (DeepSpeed's get_lr() after a step)
  bool skipped = false;  // an f16 overflow skipped the step (the scale was lowered)
  double attempted_loss_scale = 1;  // the f16 loss scale the step ran with
  // Sent on the gradients' groups (the data group, and the expert-data group under expert
  // parallelism) by the operations that finished during the step (with overlap_comm, the
  // previous step's last gathers may count here).
  int64_t comm_bytes = 0;
  std::string comm;  // 1-bit optimizers: what the step communicated; empty otherwise
  // With wall_clock_breakdown (DeepSpeed's fwd, bwd and step timers; the device is
  // synchronized around each phase): seconds of this step's forwards (with the loss) and
  // backwards over its micro-batches, and of clipping plus the optimizer step. A pipeline
  // interleaves its forwards and backwards, so there they are 0 and only `step_s` counts.
  double forward_s = 0;
  double backward_s = 0;
  double step_s = 0;
};

// The tensors of a checkpoint: what one rank saves (save_state()), or a loaded checkpoint
// (load_state()).
struct EngineCheckpoint {
  // Whole weights: saving, on the rank that writes them (empty elsewhere, and where the
  // optimizer shards the parameters: their weights are in the shards).
  StateDict model;
  // The whole optimizer state (stage 0, or a 3D run's part); empty when it is sharded.
  StateDict optimizer;
  // Saving: this rank's flat ZeRO shard (data-parallel runs at stages 1-3; empty
  // otherwise), with its f32 parameter shard (kParameterShard) where the optimizer shards
  // the parameters: produced a chunk at a time as it is written (Note [Streamed
  // checkpoints] in parallel/zero/zero_optimizer.h), valid until the next step or load.
  StreamedStateDict optimizer_shard;
  // Loading: every rank's shard, in rank order, with or without the parameter shards (a
  // checkpoint's loader may have made them the whole `model`). A run of the layout that
  // saved them loads its own shard as it is; any other, the whole state.
  std::vector<StateDict> optimizer_shards;
  // Pipeline and tensor-parallel runs (Note [3D checkpoints]). Saving: `parts` stage files
  // and the index of the one this rank writes (its whole tensors in `model` and
  // `optimizer`), or -1. Loading: the parts merged into `model` and `optimizer`.
  int parts = 0;
  int part = -1;
  // The per-rank optimizer state (ZeroOptimizer::rank_state()): saved by every rank;
  // loading, this rank's, or empty.
  StateDict rank_state;
  // Expert parallelism (Note [Expert checkpoints]). Saving: the whole weights and optimizer
  // state of this rank's experts where it writes expert part `expert_part` (-1 elsewhere) of
  // `expert_parts`. Loading: every part's, merged (a loader may have put the weights into
  // `model` instead).
  StateDict experts;
  StateDict expert_optimizer;
  int expert_parts = 0;
  int expert_part = -1;
};

// The engine's counters in a checkpoint's state.json (Engine::state_json()).
struct EngineCounters {
  int64_t step = 0;  // optimizer steps done
  int64_t scheduler_last_batch_iteration = -1;
  std::optional<nlohmann::json> grid;                 // [pipe, data, model] of the saving run
  std::optional<FlatLayout> zero_layout;              // $.zero.layout: sharded optimizer state
  std::optional<optim::LossScalerState> loss_scaler;  // f16 runs
};

class Engine {
 public:
  // Moves `model` to `device` in config.mixed_precision.dtype and builds the optimizer over
  // `param_groups` (optim::decay_groups of the model's parameters). `data` is the
  // data-parallel group; `groups`, for a pipeline or tensor slicing, the 3D groups, which
  // move tensors on `device` (`data` must be groups->data); `device_data`, the same ranks
  // as `data` over the device (an NCCL group), moves gradients, parameters and mean losses
  // instead of `data`. `expert_data`, for expert parallelism, is the expert-data group
  // (parallel/expert/expert_groups.h; over the device like `device_data`) that the model's
  // experts reduce over (Note [Expert parameters] in parallel/zero/zero_optimizer.h); not
  // with `groups`.
  // At ZeRO stage 3 the model may be unmaterialized (built under a DeferredInitGuard): its
  // init_parameter() then initializes each parameter as it is partitioned. Every argument
  // must outlive the engine. Collective.
  Engine(const EngineConfig& config, TrainableModel& model,
         std::vector<optim::ParamGroup> param_groups, Device device, Communicator& data,
         ParallelGroups* groups = nullptr, Communicator* device_data = nullptr,
         Communicator* expert_data = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One optimizer step over gradient_accumulation_steps micro-batches (host tensors; the
  // engine moves them to the device). Collective over every group.
  StepStats train_batch(const std::vector<pipeline::MicroBatch>& micro_batches);
  // The mean loss over `micro_batches` and the data-parallel ranks, without gradients, in
  // evaluation mode (no dropout). Collective.
  double eval_batch(const std::vector<pipeline::MicroBatch>& micro_batches);
  // Before a batch whose micro-batches have another shape than the last one's (a
  // curriculum's sequence length): a pipeline's stages learn the new shapes (DeepSpeed's
  // reset_activation_shape). Nothing to do without a pipeline. Every rank calls it.
  void reset_activation_shapes();

  // This rank's part of a checkpoint (Note [Data-parallel engine], Note [3D checkpoints]).
  // Collective.
  EngineCheckpoint save_state();
  // The checkpoint save_state() returned is written: what it brought into memory from NVMe
  // swap files goes back (ZeroOptimizer::swap_out_offloaded).
  void checkpoint_written() { optimizer_->swap_out_offloaded(); }
  // The counters state.json records: step, schedule position, grid, ZeRO stage and layout,
  // loss scale.
  nlohmann::json state_json() const;
  // Restores a checkpoint that any layout and ZeRO stage saved (tensors merged or sharded as
  // load_checkpoint returns them). Every tensor is checked before anything changes. The
  // per-rank state is restored only when the same layout saved it; otherwise it starts
  // afresh, with a warning. Collective.
  void load_state(const EngineCheckpoint& saved, const EngineCounters& counters);

  // Optimizer steps done (skipped f16 overflow steps included, as in DeepSpeed).
  int64_t global_steps() const { return step_; }
  // The optimizer with ZeRO (its stage, precision, loss scaler, state bytes).
  const ZeroOptimizer& optimizer() const { return *optimizer_; }
  // Whether this is a pipeline or tensor-parallel run (Note [3D engine]).
  bool model_parallel() const { return groups_ != nullptr; }
  // The group that moves gradients and parameters (the device group, or the data group).
  Communicator& gradient_group() const { return gradient_group_; }

 private:
  // Forward, loss and backward of every micro-batch without a pipeline; the mean loss, a
  // 0-dim f64 tensor on the device (not read, so the host does not wait). Their times go
  // to `stats` with wall_clock_breakdown.
  Tensor data_parallel_loss(const std::vector<pipeline::MicroBatch>& micro_batches,
                            StepStats& stats);
  // Clips, steps the optimizer and the schedule, and counts the step, into `stats`; with
  // `local_loss` defined (data_parallel_loss()'s) also the loss mean over the data group.
  void step_optimizer(StepStats& stats, const Tensor& local_loss);
  // Seconds on a steady clock after the device's queued work, with wall_clock_breakdown;
  // 0 without (no synchronization then).
  double timer_now() const;
  double global_mean(double value) const;  // over the data group
  // A 0-dim f64 device tensor summed over the data group on the device, read by
  // mean_of_sum(): the sum over the group's ranks divided by their count.
  Tensor sum_over_data(const Tensor& value) const;
  double mean_of_sum(const Tensor& sum) const;
  // [pipeline stages, data-parallel ranks, tensor-parallel ranks] of this run.
  nlohmann::json grid_json() const;
  bool first_rank() const;  // rank 0 of the world: logs warnings
  void restore_rank_state(const StateDict& saved, bool same_layout);
  // Loads this rank's own optimizer shard as it is where the checkpoint's ZeRO layout is
  // this run's (Note [Streamed checkpoints] in parallel/zero/zero_optimizer.h), with its
  // parameter shard or the whole weights; false (nothing changed) where it is not.
  // `model`: the checkpoint's weights, the experts' taken out (Note [Expert checkpoints]).
  bool load_own_shard(const EngineCheckpoint& saved, const StateDict& model,
                      const EngineCounters& counters);
  // Saving: the expert part's whole state into `c` (Note [Expert checkpoints]). Collective
  // over the expert-data group.
  void save_experts(EngineCheckpoint& c);
  // This rank's parameters that the optimizer's data part holds: all of them, or without the
  // experts' where it has an expert part (Note [Expert parameters] in
  // parallel/zero/zero_optimizer.h).
  std::vector<NamedParameter> data_part_parameters() const;
  // The expert part's: this rank's experts' parameters.
  std::vector<NamedParameter> expert_part_parameters() const;

  EngineConfig config_;
  TrainableModel& model_;
  Device device_;
  Communicator& data_;
  ParallelGroups* groups_;
  Communicator& gradient_group_;
  Communicator* expert_data_;  // expert parallelism's expert-data group, or null
  // The model's experts, for the expert part's hooks; before optimizer_, which it outlives.
  std::unique_ptr<Module> expert_modules_;
  std::unique_ptr<ZeroOptimizer> optimizer_;
  std::unique_ptr<optim::LrScheduler> scheduler_;
  std::unique_ptr<pipeline::PipelineStage> stage_;  // pipelines only
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  std::unique_ptr<Communicator> tied_;  // the stages holding tied parameters
  int64_t step_ = 0;
};

}  // namespace tessera::parallel
