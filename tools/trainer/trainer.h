// The training loop of tools/train around parallel::Engine: model, data, evaluation,
// metrics, checkpoints and exact resume, all from one RunConfig.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/language_model.h"
#include "parallel/comm/communicator.h"
#include "parallel/curriculum.h"
#include "parallel/engine/checkpoint_policy.h"
#include "parallel/engine/engine.h"
#include "parallel/expert/expert_groups.h"
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
// thread count, statically partitioned kernels, the dropout key derived from the step:
// Note [Dropout per step] in parallel/engine/engine.h). So a run killed at any point and
// resumed from `latest` computes the same losses and weights, bit for bit, as one that was
// never interrupted.
//
// Note [Trainer]
// The trainer is the loop around parallel::Engine (Note [Engine] in
// parallel/engine/engine.h): it builds the model and the groups from the run config, reads
// each rank's micro-batches (the loader shards over the data-parallel coordinate, so every
// rank of a pipeline or tensor-parallel replica reads the same ones), hands them to
// Engine::train_batch, and evaluates, logs, checkpoints and samples on the config's
// cadence. The reported loss, gradient norm and validation loss are global means,
// identical on every rank; only rank 0 logs progress, writes metrics and samples text.
// Checkpoints are saved collectively (the engine's tensors, the trainer's state.json).
//
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
  // `config` must have been resolved for world.size() ranks (load_run_config), and the
  // process set up for it (apply_run_environment). `world` moves the trainer's own CPU
  // values (resume agreement, checkpoint barriers). `device_world`, the same ranks over the
  // training device (an NCCL group for CUDA runs of several ranks), moves the training
  // tensors: gradients and parameters, and, split into the 3D groups, a pipeline's
  // activations and tensor slicing's partial sums. `world` does both when it is null.
  // Collective.
  Trainer(RunConfig config, ResumeMode resume, parallel::Communicator& world,
          parallel::Communicator* device_world = nullptr);
  ~Trainer();

  // Trains to the configured step count, evaluating, logging and checkpointing on the way,
  // then samples text when the config asks for it. Collective.
  TrainResult run();

  // The parameters, optimizer state and data cursor (for tests and tools).
  const LanguageModel& model() const { return *model_; }
  const parallel::ZeroOptimizer& optimizer() const { return engine_->optimizer(); }

 private:
  // The micro-batches of one step: the model's inputs and targets from the next windows of
  // `loader` (masked for BERT with counters from `first_counter` on, Note [Masked-LM runs]),
  // their first `tokens` positions (0: all; a curriculum's shorter sequences).
  std::vector<parallel::pipeline::MicroBatch> micro_batches(data::DataLoader& loader, int64_t count,
                                                            uint64_t first_counter,
                                                            int64_t tokens = 0) const;
  double evaluate();  // mean validation loss over eval_batches batches (of every rank)
  // Before a batch of sequences of `seq_len` tokens: a pipeline relearns its transfers'
  // shapes when they change (a curriculum's training batches, whole-window evaluations).
  void use_seq_len(int64_t seq_len);
  // The flops profiler's report of the step that made `s` (Note [Flops profiler]).
  std::string profile_report(const FlopsProfiler& profiler, const parallel::StepStats& s,
                             int64_t seq_len) const;
  bool leader() const { return world_.rank() == 0; }
  // A bf16 run on the CPU with a bf16 GEMM (Note [BF16 GEMM]): its MFU is against that
  // GEMM's peak; otherwise (f32, fp16, or no AVX512_BF16) against the FMA peak.
  bool cpu_bf16() const;
  void save_checkpoint();
  // This rank's all-to-all bytes over its expert-parallel group so far (0 without one).
  int64_t all_to_all_bytes() const;
  // Loads checkpoint `c`, read from directory `dir`.
  void restore(const std::string& dir, const CheckpointContents& c);
  void sample_text();
  // The run's shape, logged once at the start.
  void log_run(double peak_flops) const;

  RunConfig cfg_;
  parallel::Communicator& world_;
  // Pipeline or tensor-parallel runs: split from the device world where there is one.
  std::unique_ptr<parallel::ParallelGroups> groups_;
  parallel::Communicator& dp_;  // the data-parallel group (the world without 3D)
  // Expert parallelism (model.moe.ep_size > 1): split from the device world where there is
  // one; empty otherwise.
  parallel::ExpertGroups expert_groups_;
  // The recomputed segments' times (activation_checkpointing.profile), filled by the model's
  // CheckpointPolicy.
  std::shared_ptr<parallel::CheckpointTimes> checkpoint_times_ =
      std::make_shared<parallel::CheckpointTimes>();
  std::unique_ptr<LanguageModel> model_;
  std::unique_ptr<parallel::Engine> engine_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<data::DataLoader> val_loader_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<CheckpointDir> checkpoints_;
  std::unique_ptr<RunLock> run_lock_;  // the leader's lock on trainer.log_dir
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<Monitor> monitor_;  // the leader's, when a monitor section is enabled
  // $.curriculum_learning's sequence length (Note [Curriculum schedule]), when enabled.
  std::optional<parallel::CurriculumScheduler> curriculum_;
  int64_t batch_seq_len_ = 0;  // the last batch's sequence length (0: none yet)
  int64_t total_steps_ = 0;
};

// Sets up the process for `config`, explicitly, before any Trainer: the OpenMP thread count
// (trainer.threads, when above 0) and the simulated link ($.simulated_network) of `world`
// and of `device_world` (which may be null), inherited by the groups split from them.
void apply_run_environment(const RunConfig& config, parallel::Communicator& world,
                           parallel::Communicator* device_world = nullptr);

}  // namespace tessera::train
