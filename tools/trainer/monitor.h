// DeepSpeed's monitors (deepspeed/monitor/): a run's curves as TensorBoard event files
// (`tensorboard`) and as one CSV file per curve (`csv_monitor`), written by global rank 0.
// `wandb` and `comet` need network access and are refused when enabled.
//
// Note [Monitor events]
// Each event is (tag, value, step), its step being DeepSpeed's sample counter (optimizer
// steps x train_batch_size), not the step count. Per optimizer step, as DeepSpeed's engine
// (deepspeed/runtime/engine.py) writes them:
//   Train/Samples/train_loss   the step's loss, at the count before the step (0 at step 1)
//   Train/Samples/lr           the rate of the next step (DeepSpeed reads get_lr() after
//                              the scheduler moved), at the count after the step
//   Train/Samples/loss_scale   fp16's loss scale after the step (fp16 runs only)
//   Train/Samples/elapsed_time_ms_forward, _backward, _step
//                              with wall_clock_breakdown: the step's phases in ms
// after each evaluation Train/Samples/eval_loss (DeepSpeed's PipelineEngine's tag), and
// Tessera's own, at the count after the step: grad_norm, tokens_per_s, mfu, comm_bytes (the
// gradients' groups), all_to_all_bytes (expert parallelism), and per mixture-of-experts
// block b: moe_block<b>_aux_loss, moe_block<b>_dropped, moe_block<b>_expert<e>_tokens.
// Unlike DeepSpeed's engine, whose train_loss is rank 0's own, the loss is the mean over the
// data-parallel ranks (as DeepSpeed's PipelineEngine writes it), the value metrics.jsonl
// holds; DeepSpeed's _backward_inner and _backward_allreduce timers are not written (the
// engine times backward whole). Every write of a step's events ends with a flush.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "tools/trainer/csv_monitor.h"
#include "tools/trainer/tensorboard_writer.h"

namespace tessera::train {

// DeepSpeed's `tensorboard` or `csv_monitor` section.
struct MonitorSection {
  bool enabled = false;
  std::string output_path;  // empty: the trainer's log_dir (DeepSpeed: the working folder)
  std::string job_name = "DeepSpeedJobName";
  // Where the files go: output_path (or `default_dir`) / job_name.
  std::string folder(const std::string& default_dir) const;
};

struct MonitorConfig {
  MonitorSection tensorboard;
  MonitorSection csv;
  bool enabled() const { return tensorboard.enabled || csv.enabled; }
};

// Reads $.tensorboard, $.csv_monitor, $.wandb and $.comet with DeepSpeed's keys (an unknown
// one is an error, as DeepSpeed's pydantic models make it); an enabled wandb or comet fails
// with "needs network access; use tensorboard or csv_monitor".
MonitorConfig read_monitor_config(JsonObjectReader& root);

struct MonitorEvent {
  std::string tag;
  double value = 0;
  int64_t step = 0;  // the sample counter
};

// The events of one training step (Note [Monitor events]) from its metrics.jsonl record
// (tools/trainer/metrics.h: step, loss, grad_norm, tokens_per_s, mfu, comm_bytes, and
// all_to_all_bytes, moe, forward_ms, backward_ms, step_ms where present), with the next
// step's rate and fp16's loss scale after the step.
std::vector<MonitorEvent> train_step_events(const nlohmann::json& record, int64_t train_batch_size,
                                            double next_lr, std::optional<double> loss_scale);
// The event of an evaluation after step `step`.
MonitorEvent eval_event(int64_t step, double val_loss, int64_t train_batch_size);

class Monitor {
 public:
  // Opens the enabled backends. `default_dir` stands for an empty output_path. A resumed run
  // passes the sample count of its checkpoint as `keep_through`, a fresh one -1 (Note [CSV
  // monitor files]); TensorBoard gets a new event file either way, a resumed run's starting
  // with a SessionLog START just past the checkpoint (Note [TensorBoard event files]).
  Monitor(const MonitorConfig& config, const std::string& default_dir, int64_t keep_through);
  // Writes `events` to each backend, then flushes.
  void write_events(const std::vector<MonitorEvent>& events);

 private:
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<CsvMonitor> csv_;
};

}  // namespace tessera::train
