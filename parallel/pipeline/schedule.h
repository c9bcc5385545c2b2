// Pipeline schedules as data: a pure function of (micro-batches,
// stages, stage) returns the instruction list a stage executes, DeepSpeed's TrainSchedule
// (synchronous 1F1B) and InferenceSchedule (deepspeed/runtime/pipe/schedule.py).
// An executor runs the list; the schedules themselves are tested without communication.
//
// Note [1F1B schedule]
// A training batch of M micro-batches on S stages takes 2 (M + S - 1) steps. On step k,
// stage s runs a forward when k and s have the same parity and a backward otherwise, each
// for the micro-batch DeepSpeed's formulas give (idle when it is outside [0, M)). A forward
// step first sends the gradient of the previous step's backward upstream and receives this
// micro-batch's activation; a backward step receives this micro-batch's gradient and sends
// the previous step's activation downstream. Neighbouring stages have opposite parity, so
// every send meets the matching receive on the same step and blocking point-to-point
// cannot deadlock. A stage keeps at most max(2, min(S - s, M)) micro-batches in flight,
// each in buffer mb % buffers. The last step reduces tied and data-parallel gradients and
// steps the optimizer.
#pragma once

#include <string>
#include <vector>

namespace tessera::parallel::pipeline {

enum class PipeOp {
  load_micro_batch,   // the first stage loads inputs, the last stage labels
  forward,            //
  backward,           //
  send_activation,    // to the next stage
  recv_activation,    // from the previous stage
  send_grad,          // the input's gradient, to the previous stage
  recv_grad,          // the output's gradient, from the next stage
  reduce_tied_grads,  // over the stages that hold a tied weight
  reduce_grads,       // over the data-parallel group
  optimizer_step,
};

// One instruction; buffer ops carry the buffer and the micro-batch it holds (-1 for the
// others).
struct PipeInstruction {
  PipeOp op;
  int buffer = -1;
  int micro_batch = -1;
  bool operator==(const PipeInstruction&) const = default;
};

// "Load(0)", "Fwd(1)", "SendAct(0)", "RecvGrad(1)", "ReduceTied", "ReduceGrads", "OptStep":
// DeepSpeed's names, with the buffer.
std::string to_string(const PipeInstruction& instruction);

// Instructions that may be separated by a barrier without deadlock.
using PipeStep = std::vector<PipeInstruction>;

// Buffers stage `stage` needs under the training schedule: max(2, min(stages - stage, M)).
int train_buffers(int micro_batches, int stages, int stage);

// The 1F1B training schedule of `stage` (Note [1F1B schedule]). Throws unless
// micro_batches >= 1, stages >= 1 and 0 <= stage < stages.
std::vector<PipeStep> train_schedule(int micro_batches, int stages, int stage);

// DeepSpeed's InferenceSchedule: M + S - 1 steps, micro-batch k - s on step k, forwards
// only, two buffers alternating by step. Even stages send before they receive and odd
// stages receive before they send, so the pairs meet.
std::vector<PipeStep> inference_schedule(int micro_batches, int stages, int stage);

}  // namespace tessera::parallel::pipeline
