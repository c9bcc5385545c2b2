// What a run shows while it trains: tokens per second and MFU over the steps since the
// last report, the time left, and on a terminal a progress bar between report lines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm/communicator.h"
#include "parallel/engine/checkpoint_policy.h"
#include "parallel/engine/engine.h"
#include "parallel/expert/expert_groups.h"
#include "parallel/topology.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::train {

// DeepSpeed's wall_clock_breakdown report: the mean forward, backward and optimizer-step
// milliseconds per step since the last report, from parallel::StepStats' timers.
class StepTimes {
 public:
  void add(const parallel::StepStats& stats);
  // "time (ms) | fwd: 12.31 | bwd: 25.02 | step: 3.10", then starts a new window.
  std::string report();

 private:
  double forward_s_ = 0, backward_s_ = 0, step_s_ = 0;
  int64_t steps_ = 0;
};

// activation_checkpointing.profile's report: the checkpointed segments' mean forward and
// recomputation-with-backward milliseconds per step since the last report.
class CheckpointProfile {
 public:
  // `times`: what the model's CheckpointPolicy adds its segments' seconds into.
  explicit CheckpointProfile(std::shared_ptr<parallel::CheckpointTimes> times);
  // After each optimizer step.
  void add_step() { ++steps_; }
  // "activation checkpoints per step | segments: 4.0 | forward ms: 1.20 | recompute and
  // backward ms: 3.75", then starts a new window.
  std::string report();

 private:
  std::shared_ptr<parallel::CheckpointTimes> times_;
  int64_t steps_ = 0;
};

// Throughput over a window of steps (since the last report), and the mean step time for
// the time left: the first step of a run warms caches and is left out once there are
// others.
class ThroughputMeter {
 public:
  // `peak_flops`: every rank's together (PaLM's MFU: model FLOPs over the hardware peak);
  // 0 when unknown, and then mfu() is 0.
  explicit ThroughputMeter(double peak_flops);
  // After each step, with its wall time, tokens and model FLOPs (a curriculum's steps differ).
  void add_step(double seconds, int64_t tokens, double flops);
  // Starts a new window (after a report).
  void start_window();
  double tokens_per_s() const;  // over the window
  double mfu() const;           // tokens_per_s x flops per token / peak
  double step_seconds() const;  // the mean, for the time left

 private:
  double peak_flops_;
  double window_s_ = 0, window_tokens_ = 0, window_flops_ = 0, timed_s_ = 0, last_s_ = 0;
  int64_t steps_ = 0;
};

// The leader's terminal output: a log line at every `steps_per_print`-th step and at the
// last, and when stderr is a terminal a bar in between. Other ranks print nothing.
class ProgressReporter {
 public:
  ProgressReporter(bool leader, int64_t total_steps, int64_t steps_per_print);
  // Shows step `step` (optimizer steps done); returns whether it was a report step.
  bool show(int64_t step, const parallel::StepStats& stats, const ThroughputMeter& meter);

 private:
  bool leader_;
  bool bar_;  // stderr is a terminal
  int64_t total_steps_;
  int64_t steps_per_print_;
};

// Rank 0's bytes sent per step over `steps` steps, logged at the end of a run: on the
// gradients' group (with its per-operation summary) when data parallel, and on each of the
// 3D `groups` when there are some, and on the expert groups of expert parallelism.
void log_communication(const parallel::Communicator& gradients,
                       const parallel::ParallelGroups* groups,
                       const parallel::ExpertGroups& experts, int64_t steps);

// Rank 0's memory, logged at the end of a run: the three places of DeepSpeed's estimates
// (estimate_zero3_model_states_mem_needs: device, host, NVMe), measured. Its model states
// in the memory of `device` (the CPU's is the host's) and in the NVMe swap file, with the
// device allocator's peak on a GPU and the process's peak resident bytes.
void log_memory(const parallel::ZeroOptimizer& optimizer, Device device);

}  // namespace tessera::train
