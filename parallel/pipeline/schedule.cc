#include "parallel/pipeline/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::parallel::pipeline {
namespace {

void check_shape(const char* schedule, int micro_batches, int stages, int stage) {
  TS_CHECK(micro_batches >= 1 && stages >= 1 && stage >= 0 && stage < stages, "[pipeline] ",
           schedule, ": expected micro-batches >= 1, stages >= 1 and 0 <= stage < stages, found ",
           micro_batches, " micro-batches, ", stages, " stages, stage ", stage);
}

// Which micro-batch stage `stage` works on at step `k` of the training schedule, and
// whether it is a forward (Note [1F1B schedule]; DeepSpeed's _step_to_micro_batch).
struct StepWork {
  int micro_batch;
  bool forward;
};

StepWork step_work(int k, int stages, int stage) {
  const bool even_k = k % 2 == 0, even_s = stage % 2 == 0;
  if (even_k && even_s) return {k / 2 - stage / 2, true};
  if (!even_k && !even_s) return {(k - 1) / 2 - stage / 2, true};
  if (even_k) return {k / 2 - stages + (stage + 1) / 2, false};  // odd stage
  return {(k - 1) / 2 - stages + 1 + stage / 2, false};          // odd step, even stage
}

}  // namespace

std::string to_string(const PipeInstruction& in) {
  const std::string b = "(" + std::to_string(in.buffer) + ")";
  switch (in.op) {
    case PipeOp::load_micro_batch:
      return "Load" + b;
    case PipeOp::forward:
      return "Fwd" + b;
    case PipeOp::backward:
      return "Bwd" + b;
    case PipeOp::send_activation:
      return "SendAct" + b;
    case PipeOp::recv_activation:
      return "RecvAct" + b;
    case PipeOp::send_grad:
      return "SendGrad" + b;
    case PipeOp::recv_grad:
      return "RecvGrad" + b;
    case PipeOp::reduce_tied_grads:
      return "ReduceTied";
    case PipeOp::reduce_grads:
      return "ReduceGrads";
    case PipeOp::optimizer_step:
      return "OptStep";
  }
  return "?";
}

int train_buffers(int micro_batches, int stages, int stage) {
  check_shape("train schedule", micro_batches, stages, stage);
  return std::max(2, std::min(stages - stage, micro_batches));
}

std::vector<PipeStep> train_schedule(int micro_batches, int stages, int stage) {
  const int buffers = train_buffers(micro_batches, stages, stage);
  const bool first = stage == 0, last = stage == stages - 1;
  auto valid = [&](int mb) { return mb >= 0 && mb < micro_batches; };
  auto at = [&](PipeOp op, int mb) { return PipeInstruction{op, mb % buffers, mb}; };
  const int total = 2 * (micro_batches + stages - 1);
  std::vector<PipeStep> steps;
  int prev = -1;  // the micro-batch of the previous step
  for (int k = 0; k < total; ++k) {
    const auto [mb, forward] = step_work(k, stages, stage);
    PipeStep cmds;
    if (forward) {
      if (valid(prev) && !first) cmds.push_back(at(PipeOp::send_grad, prev));
      if (valid(mb) && !first) cmds.push_back(at(PipeOp::recv_activation, mb));
    } else {
      if (valid(mb) && !last) cmds.push_back(at(PipeOp::recv_grad, mb));
      if (valid(prev) && !last) cmds.push_back(at(PipeOp::send_activation, prev));
    }
    if ((first || last) && forward && valid(mb)) cmds.push_back(at(PipeOp::load_micro_batch, mb));
    if (valid(mb)) cmds.push_back(at(forward ? PipeOp::forward : PipeOp::backward, mb));
    if (k == total - 1) {
      cmds.push_back({PipeOp::reduce_tied_grads});
      cmds.push_back({PipeOp::reduce_grads});
      cmds.push_back({PipeOp::optimizer_step});
    }
    prev = mb;
    steps.push_back(std::move(cmds));
  }
  return steps;
}

std::vector<PipeStep> inference_schedule(int micro_batches, int stages, int stage) {
  check_shape("inference schedule", micro_batches, stages, stage);
  const bool first = stage == 0, last = stage == stages - 1, even = stage % 2 == 0;
  auto valid = [&](int mb) { return mb >= 0 && mb < micro_batches; };
  std::vector<PipeStep> steps;
  for (int k = 0; k < micro_batches + stages - 1; ++k) {
    const int mb = k - stage;
    const int recv_buf = even ? k % 2 : (k + 1) % 2;
    const int send_buf = even ? (k + 1) % 2 : k % 2;
    PipeStep cmds;
    if ((first || last) && valid(mb)) cmds.push_back({PipeOp::load_micro_batch, recv_buf, mb});
    const bool send = !last && valid(mb - 1), recv = !first && valid(mb);
    const PipeInstruction send_in{PipeOp::send_activation, send_buf, mb - 1};
    const PipeInstruction recv_in{PipeOp::recv_activation, recv_buf, mb};
    if (even) {
      if (send) cmds.push_back(send_in);
      if (recv) cmds.push_back(recv_in);
    } else {
      if (recv) cmds.push_back(recv_in);
      if (send) cmds.push_back(send_in);
    }
    if (valid(mb)) cmds.push_back({PipeOp::forward, recv_buf, mb});
    steps.push_back(std::move(cmds));
  }
  return steps;
}

}  // namespace tessera::parallel::pipeline
