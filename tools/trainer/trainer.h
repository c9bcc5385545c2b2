// The training loop of tools/train: model, optimizer, schedule, data, evaluation, metrics,
// checkpoints and exact resume, all from one RunConfig.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "models/bert/bert.h"
#include "models/gpt2/gpt.h"
#include "models/gpt2/pipeline_stage.h"
#include "models/language_model.h"
#include "optim/lr_schedule.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/executor.h"
#include "parallel/topology.h"
#include "parallel/zero/zero_optimizer.h"
#include "tools/data/loader.h"
#include "tools/data/tokenizer.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/metrics.h"
#include "tools/trainer/run_config.h"
#include "tools/trainer/run_lock.h"
#include "tools/trainer/trainer_state.h"

namespace tessera::train {

enum class ResumeMode : uint8_t {
  automatic,  // continue from `latest` when a checkpoint exists
  required,   // continue from `latest`; error when there is none
  never,      // start from step 0 (existing checkpoints are overwritten as steps recur)
};

struct TrainResult {
  int64_t steps = 0;               // optimizer steps completed
  double last_loss = 0;            // training loss of the last step
  std::optional<double> val_loss;  // the final evaluation
  double seconds = 0;              // wall time of this invocation
};

// Note [Exact resume]
// A checkpoint holds the parameters, the optimizer moments and step, the schedule position
// and the data cursor; the loop is otherwise a pure function of those and the config (fixed
// thread count, statically partitioned kernels). So a run killed at any point and resumed
// from `latest` computes the same losses and weights, bit for bit, as one that was never
// interrupted. The dropout stream is derived, not saved: step s draws from the Philox key
// hash(k, s), k being the model's own dropout key, at offset 0. A saved offset would be
// wrong for every rank that draws a different amount than the one that wrote it (each
// pipeline stage does), and a derived one needs nothing per rank.
//
// Note [Data-parallel trainer]
// The trainer runs one data-parallel rank of `dp` (size 1 for a single process): every
// rank builds the same model and reads its part of each global batch (the loader's
// rank/world sharding), and ZeroOptimizer (stages 0-2) reduces gradients and steps. The
// reported loss, gradient norm and validation loss are global means, identical on every
// rank; only rank 0 logs progress, writes metrics and samples text. Checkpoints are saved
// collectively, and a checkpoint of any world size and ZeRO stage 0-2 resumes at any other
// (optimizer state is resharded through whole per-parameter tensors).
// Note [3D trainer]
// With pipeline.stages P or tensor_parallel.tp_size T above 1, the world is the grid of
// Note [3D grid] (parallel/topology.h): each rank builds its stage's part of the model
// (models/gpt2/stage.h) as tensor-parallel slices over its model group, ZeroOptimizer
// (stages 0-1 with a pipeline, 0-2 with slicing alone) shards over its data group, and the
// gradient norm adds up over the replica's pipe x model group. A step runs the 1F1B
// schedule over gradient_accumulation_steps micro-batches (parallel/pipeline/executor.h),
// sums the tied embedding's gradients over the first and last stages, then reduces and
// steps; every rank of a replica reads the same micro-batches (the loader shards over the
// data coordinate). Runs are CPU ranks (threads or mpirun).
//
// Note [3D checkpoints]
// A pipeline or tensor-parallel run saves whole tensors: each rank gathers its optimizer
// state over its data group and both weights and state over its model group; the data-0,
// model-0 rank of each stage writes model_part_<s> and optimizer_part_<s>. Loading merges
// the parts into one whole checkpoint, which any run, of any (P, T, data) and ZeRO stage
// 0-2, slices to what it holds (tools/trainer/model_parallel_state.h): resuming at the same
// layout is exact, and tools/generate and zero_to_fp32 read the same files.
// Note [Masked-LM runs]
// With model.type "bert" the trainer trains a BERT-style encoder (models/bert/bert.h) on
// the same token windows: each micro-batch is masked by BERT's 80/10/10 rule with a Philox
// key of (seed, counter), counter = (step x GAS + micro) x dp + rank, so every rank masks
// its own windows differently, and a resumed run masks exactly as an uninterrupted one.
// Evaluation uses fixed counters, so every evaluation scores the same masked positions.
// The loss is the mean cross-entropy over the masked positions. BERT runs are data
// parallel with ZeRO 0-3; pipelines, tensor slicing, init_from and sampling are GPT's.
class Trainer {
 public:
  // `config` must have been resolved for world.size() ranks (load_run_config). `world`
  // moves the trainer's own CPU values (resume agreement, mean losses, checkpoint
  // barriers) and, with a pipeline or tensor slicing, is split into the 3D groups (Note
  // [3D trainer]); `device_dp`, the same ranks over the training device (an NCCL group
  // for CUDA data-parallel runs), moves gradients and parameters; world does both when it
  // is null. Collective.
  Trainer(RunConfig config, ResumeMode resume, parallel::Communicator& world,
          parallel::Communicator* device_dp = nullptr);
  ~Trainer();

  // Trains to the configured step count, evaluating, logging and checkpointing on the way,
  // then samples text when the config asks for it. Collective.
  TrainResult run();

  // The parameters, optimizer state and data cursor (for tests and tools).
  const LanguageModel& model() const { return *model_; }
  const parallel::ZeroOptimizer& optimizer() const { return *optimizer_; }

 private:
  double train_step();  // one optimizer step; returns the mean micro-batch loss
  // The model's inputs and targets from a window of the data (Note [Masked-LM runs]):
  // the window and its next tokens for GPT, its masking number `counter` for BERT.
  data::Batch model_batch(const data::Batch& window, uint64_t counter) const;
  // The model section as checkpoints record it (with the sparse layout of a BERT run).
  nlohmann::json model_json() const;
  double evaluate();  // mean validation loss over eval_batches batches (of every rank)
  // The mean of `value` over the data-parallel ranks.
  double global_mean(double value) const;
  bool leader() const { return world_.rank() == 0; }
  void save_checkpoint();
  // Loads checkpoint `c`, read from directory `dir`.
  void restore(const std::string& dir, const CheckpointContents& c);
  // Loads the 1-bit optimizer's per-rank state when the checkpoint has it and was saved by
  // the same rank layout; otherwise starts it afresh with a warning.
  void restore_rank_state(const StateDict& saved, bool same_layout);
  nlohmann::json state_json() const;
  // [pipeline stages, data-parallel ranks, tensor-parallel ranks]: the run's rank layout.
  nlohmann::json grid_json() const;
  void sample_text();

  // True for pipeline or tensor-parallel runs (Note [3D trainer]).
  bool model_parallel() const { return groups_ != nullptr; }
  void save_model_parallel_checkpoint();
  double pipeline_step();  // the pipeline's part of train_step(): the mean loss
  // Clips, steps the optimizer and the schedule; the global mean of `loss`.
  double finish_step(double loss);
  // Keys the model's dropout stream for step `step` (Note [Exact resume]).
  void key_dropout(int64_t step);

  RunConfig cfg_;
  parallel::Communicator& world_;
  std::unique_ptr<parallel::ParallelGroups> groups_;  // pipeline or tensor-parallel runs
  parallel::Communicator& dp_;              // the data-parallel group (the world without 3D)
  parallel::Communicator& gradient_group_;  // ZeroOptimizer's group: dp_ or the device group
  std::unique_ptr<LanguageModel> model_;
  uint64_t dropout_key_ = 0;  // the model's own dropout key, before any step re-keyed it
  Gpt* gpt_ = nullptr;        // model_ of a GPT run
  std::unique_ptr<GptPipelineStage> stage_;  // pipelines only
  std::unique_ptr<parallel::pipeline::PipelineExecutor> executor_;
  std::unique_ptr<parallel::Communicator> tied_;  // first and last stage, tied head
  std::unique_ptr<parallel::ZeroOptimizer> optimizer_;
  std::unique_ptr<optim::LrScheduler> scheduler_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<data::DataLoader> val_loader_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<CheckpointDir> checkpoints_;
  std::unique_ptr<RunLock> run_lock_;  // the leader's lock on trainer.log_dir
  std::unique_ptr<MetricsLog> metrics_;
  int64_t step_ = 0;  // optimizer steps done
  int64_t total_steps_ = 0;
  double last_grad_norm_ = 0;
  std::string comm_path_;  // 1-bit optimizers: what the last step communicated
  int64_t step_bytes_start_ = 0;
  int64_t step_bytes_ = 0;  // sent on the gradients' group in the last step
};

}  // namespace tessera::train
