// The DeepSpeed engine keys of a run config: batch triple, optimizer, scheduler, clipping,
// precision, ZeRO, activation checkpointing, logging cadence.
//
// Keys have DeepSpeed's meaning and defaults (deepspeed/runtime/config.py and constants.py);
// unlike DeepSpeed, every key is validated (Note [Strict config reading] in core/json.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "core/json.h"
#include "optim/config.h"
#include "optim/loss_scaler.h"
#include "parallel/comm/communicator.h"
#include "parallel/curriculum.h"
#include "parallel/elasticity.h"
#include "parallel/layer_drop.h"
#include "parallel/zero/mixed_precision.h"
#include "parallel/zero/zero_config.h"

namespace tessera::parallel {

struct BatchConfig {
  int64_t train_batch_size = 0;                // samples per optimizer step, all ranks
  int64_t train_micro_batch_size_per_gpu = 0;  // samples per forward/backward on one rank
  int64_t gradient_accumulation_steps = 0;     // micro-batches per optimizer step
};

// DeepSpeed's _set_batch_related_parameters + _batch_assertion: fills the missing member of
// the triple by floor division over `dp_world_size`, then checks the invariant with
// DeepSpeed's messages, e.g. "Check batch related parameters. train_batch_size is not equal
// to micro_batch_per_gpu * gradient_acc_step * world_size 32 != 3 * 2 * 4".
BatchConfig resolve_batch(std::optional<int64_t> train_batch_size,
                          std::optional<int64_t> micro_batch_per_gpu,
                          std::optional<int64_t> gradient_accumulation_steps,
                          int64_t dp_world_size);

// $.activation_checkpointing: how recomputed segments keep their inputs and what runs
// around them (parallel/engine/checkpoint_policy.h); recomputation itself is switched on by
// model.checkpoint_activations or pipeline.activation_checkpoint_interval.
struct ActivationCheckpointingConfig {
  bool partition_activations = false;  // over the tensor-parallel group
  bool cpu_checkpointing = false;      // kept inputs in host memory
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;  // segment times in the trainer's log
  // Whether any option needs recomputed segments to act on.
  bool any() const {
    return partition_activations || cpu_checkpointing || synchronize_checkpoint_boundary || profile;
  }
};

// $.pipeline: the stages of a pipeline (DeepSpeed's PipelineModule arguments).
struct PipelineConfig {
  int64_t stages = 1;
  std::string partition_method = "parameters";  // "uniform" or "type:<regex>" too
  // Blocks per activation checkpoint (0: off): every k consecutive transformer blocks of a
  // stage are recomputed in backward instead of keeping their activations.
  int64_t activation_checkpoint_interval = 0;
  // With tensor slicing, activations / gradients between stages move in 1/tp pieces
  // (DeepSpeed's defaults; Note [Partitioned stage transfers] in
  // parallel/pipeline/executor.h).
  bool pipe_partitioned = true;
  bool grad_partitioned = true;
  // Sends and receives between stages go through the pipe group's async collectives, so a
  // stage computes while its outputs travel (Note [Non-blocking stage transfers] in
  // parallel/pipeline/executor.h); false blocks on each. A Tessera key: DeepSpeed's
  // transfers block.
  bool overlap_transfers = true;
};

// $.tensor_parallel: Megatron-style tensor slicing.
struct TensorParallelConfig {
  int64_t tp_size = 1;
  // Column-parallel layers sum their input gradients while computing their weight
  // gradients (Note [Overlapped input gradients] in parallel/tensor/layers.h; Megatron's
  // --async-tensor-model-parallel-allreduce, on by default there too).
  bool overlap_comm = true;
  // Pieces each micro-batch is cut into along the batch dim around the blocks, so that one
  // piece's row-parallel sums travel while another computes (Note [Batch-split overlap] in
  // models/gpt2/batch_split.h; DeepSpeed's Domino); 1: whole micro-batches. A Tessera key.
  int64_t batch_split = 1;
};

struct EngineConfig {
  // The batch keys as written; `batch` is resolved from them by finish_engine_config().
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  BatchConfig batch;
  // $.elasticity when enabled: the batch comes from it instead of the keys above (Note
  // [Elastic batch] in parallel/elasticity.h).
  std::optional<ElasticityConfig> elasticity;
  // $.curriculum_learning (Note [Curriculum schedule] in parallel/curriculum.h): the trainer
  // truncates the training sequences to the schedule's length.
  CurriculumConfig curriculum;
  // $.progressive_layer_drop (Note [Progressive layer drop] in parallel/layer_drop.h): the
  // engine gives the model each step's theta.
  LayerDropConfig layer_drop;
  optim::OptimizerConfig optimizer;
  // The `scheduler` section; absent means a constant learning rate.
  std::shared_ptr<const optim::LrSchedule> scheduler;
  double gradient_clipping = 0.0;  // 0: no clipping (DeepSpeed's code default)
  int64_t steps_per_print = 10;    // DeepSpeed's documented default
  ZeroConfig zero;                 // $.zero_optimization
  // Parameter, gradient and activation dtype: f32, or f16/bf16 with fp32 master weights
  // and optimizer state ($.fp16.enabled / $.bf16.enabled); $.fp16's scaler keys;
  // $.communication_data_type and $.data_types.grad_accum_dtype (Note [Mixed precision] in
  // parallel/zero/zero_optimizer.h).
  MixedPrecision mixed_precision;
  bool wall_clock_breakdown = false;
  ActivationCheckpointingConfig activation_checkpointing;
  PipelineConfig pipeline;
  TensorParallelConfig tensor_parallel;
  // World / (pipeline stages x tp_size), set by finish_engine_config().
  int64_t data_parallel_size = 1;
  // $.simulated_network (a Tessera extension, not a DeepSpeed key): the link every rank's
  // communicators model (Note [Simulated link] in parallel/comm/communicator.h); off when
  // the section is absent.
  SimulatedLink simulated_link;
};

// Tessera's stand-ins for the objects a DeepSpeed client passes to deepspeed.initialize()
// (optimizer=, lr_scheduler=): Megatron-LM and Hugging Face configs carry no `optimizer`
// section because their framework builds the optimizer. Each is a reader over a section of
// DeepSpeed's schema elsewhere in the config ($.trainer.optimizer, $.trainer.scheduler).
struct ClientSections {
  std::optional<JsonObjectReader> optimizer;
  std::optional<JsonObjectReader> scheduler;
};

// Reads the engine keys from the root of a run config (other sections are left for the
// caller's finish()). The optimizer comes from $.optimizer or else from client.optimizer,
// the schedule from $.scheduler or else client.scheduler (constant without either); a
// section given in both places is an error, as is no optimizer at all. The caller refuses fp16/bf16
// on a CPU run (it knows the device); LAMB with ZeRO stage >= 1 or tensor slicing is refused (its
// trust ratio needs whole tensors), as are ZeRO stages 2-3 with a pipeline (DeepSpeed's rule) and
// stage 3 with tensor slicing; the DeepSpeed features Tessera does not have yet are refused by
// name.
EngineConfig parse_engine_config(JsonObjectReader& root, const ClientSections& client = {});
// Lays `world_size` ranks out as (pipeline stages, data, tp_size) and resolves the batch
// triple over the data-parallel size. Throws when the world does not factor. Call it
// after the root reader's finish(), so that a misspelt batch key is reported as unknown
// rather than as missing.
void finish_engine_config(EngineConfig& config, int64_t world_size);

}  // namespace tessera::parallel
