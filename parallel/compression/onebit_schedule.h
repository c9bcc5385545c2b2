// When the 1-bit optimizers communicate what (deepspeed/runtime/fp16/onebit/adam.py and
// zoadam.py), as data: which kind each optimizer step is, so the timelines are tested
// without communication and the optimizers only follow them.
//
// Note [0/1 Adam timeline]
// Step 1 is DeepSpeed's dummy initialization step. While the step is at most
// var_freeze_step, a step whose number is a multiple of var_interval is a variance step
// (gradients all-reduced in full precision, both moments updated); the others all-reduce
// the gradient in 1 bit and update the momentum only. Every var_update_scaler variance
// steps var_interval doubles. After the first step past var_freeze_step the variance is
// frozen and the local-step phase starts: every step updates locally, and a step whose
// number is a multiple of local_step_interval also synchronizes the accumulated update in
// 1 bit; every local_step_scaler steps the interval doubles, up to local_step_clipper
// (DeepSpeed caps the interval, not the exponent).
#pragma once

#include <cstdint>

namespace tessera::parallel {

enum class OneBitStep : uint8_t {
  init,            // DeepSpeed's dummy first step: nothing changes but the step count
  full_precision,  // gradients all-reduced uncompressed (1-bit Adam's warm-up; 0/1 Adam's variance)
  compressed,      // 1-bit Adam: the momentum all-reduced in 1 bit, the variance frozen
  onebit_gradient,  // 0/1 Adam: the gradient all-reduced in 1 bit, the momentum updated
  local,            // 0/1 Adam: a local update, no communication
  local_sync,       // 0/1 Adam: a local update, then the accumulated update in 1 bit
};

const char* onebit_step_name(OneBitStep kind);

// 1-bit Adam: step 1 init, steps 2..freeze_step in full precision, later ones compressed.
// `step` counts from 1.
OneBitStep onebit_adam_step(int64_t step, int64_t freeze_step);

// 0/1 Adam's counters (Note [0/1 Adam timeline]); next() gives each step's kind in turn.
class ZeroOneAdamSchedule {
 public:
  // Throws unless var_update_scaler, local_step_scaler and local_step_clipper are >= 1.
  ZeroOneAdamSchedule(int64_t var_freeze_step, int64_t var_update_scaler, int64_t local_step_scaler,
                      int64_t local_step_clipper);

  // The kind of the next step, and advances to it.
  OneBitStep next();
  // Steps taken so far.
  int64_t step() const { return step_; }
  // Whether the next step needs the gradients all-reduced in full precision (DeepSpeed's
  // enable_backward_allreduce).
  bool next_is_full_precision() const;

  // Whether the variance is frozen: true from the end of the first step past
  // var_freeze_step, so every later step is local or local_sync.
  bool variance_frozen() const { return frozen_; }

 private:
  int64_t var_freeze_step_, var_update_scaler_, local_step_scaler_, local_step_clipper_;
  int64_t step_ = 0;
  bool frozen_ = false;
  int64_t var_interval_ = 1, var_counter_ = 0;
  int64_t local_interval_ = 1, local_counter_ = 0;
};

}  // namespace tessera::parallel
