// Runs the pipeline schedules (parallel/pipeline/schedule.h) over a stage's model and the
// pipe group: micro-batches in, activations and gradients sent between neighbouring
// stages, losses out (DeepSpeed's PipelineEngine, deepspeed/runtime/pipe/engine.py).
//
// Note [Pipeline executor]
// Rank s of the pipe group is stage s. The executor walks its stage's instruction list:
// LoadMicroBatch takes a micro-batch's inputs (first stage) or labels (last stage);
// RecvActivation fills a buffer's input, which then requires grad; ForwardPass runs the
// stage (and, on the last stage, its loss); SendActivation sends the output; RecvGrad takes
// the output's gradient; BackwardPass backpropagates it (the loss / M on the last stage);
// SendGrad sends the input's gradient. The first message each way carries the tensor's
// shape and dtype (an i64 header), later ones only the data, whose shape must not change
// within a run. The schedule's closing ReduceTiedGrads, ReduceGrads and OptimizerStep run
// the caller's StepHooks (the engine's tied-weight sum, gradient reduction and optimizer
// step), so the schedule, not the caller, orders them. The loss is the mean over
// micro-batches on the last stage, broadcast to every stage.
//
// Note [Partitioned stage transfers]
// With tensor slicing, the activation a stage sends (a transformer block's output, after
// its row-parallel all-reduce) and the gradient it sends back (all-reduced by the
// column-parallel input's backward) are the same on every rank of its tensor-parallel
// group, so each of those ranks sending all of it to its peer moves the same bytes tp
// times. DeepSpeed's pipe_partitioned and grad_partitioned (deepspeed/runtime/pipe/engine.py,
// PartitionedTensor) send only this rank's 1/tp of the flat tensor (zero-padded to a
// multiple of tp) and all-gather the pieces over the tensor-parallel group after the
// receive: the stage-to-stage bytes drop by tp, the intra-node group carries the rest,
// and the tensor received is bit for bit the one sent.
//
// Note [Non-blocking stage transfers]
// With `nonblocking` (the default) every send and receive of the pipe group goes through
// AsyncCollectives (parallel/comm/async_collectives.h): a send is started and the stage
// computes on while its tensor travels, a receive is started and waited for where its
// tensor is needed, so the group sees the blocking executor's operations in the same order
// on its worker. The tensors sent are kept (the outputs until their backward) or owned by
// the handle (gradients, headers, pieces), so none changes while travelling. The loss
// broadcast at the end of a batch waits for everything first, and so does the optimizer
// step (a failed send stops the step, as a blocking one did). Where the backend has a
// worker (thread ranks, MPI), each direction of each link is a lane of its own (Note [Pipe
// lanes] in parallel/pipeline/lanes.h) and receives are started ahead: at the batch's start
// and as each is taken, one ahead of the one being used (kReceivesAhead), so a stage's next input
// travels while it computes on the current one; buffers the receives fill are allocated
// when they are started. After a failure the lanes are cancelled (Communicator::cancel):
// a receive started ahead whose send will not come ends at once instead of at the timeout,
// and the executor cannot be used again. NCCL queues the transfers on its stream instead of
// a worker (Note [Device-queued operations] in parallel/comm/communicator.h), receiving
// where needed; host staging blocks. pipeline.overlap_transfers false
// (parallel/engine_config.h) makes the engine's executor block.
//
// Note [Sends before receives]
// DeepSpeed's schedule puts a step's receives before its sends (stage 0 of two: RecvGrad(0)
// SendAct(1) Bwd(0)), which blocking transfers need so that neighbours pair up; but a send
// that waits behind a receive holds the next micro-batch's activation until the gradient
// has come back, and the link's time then lies on the critical path twice per micro-batch.
// With lanes a send never waits for anything, so each step's sends are started ahead of
// the receives before them in the step (they send what earlier steps computed); nothing
// else moves. Without lanes (one worker per group, NCCL's one stream) a send queued before
// a receive could wait for a peer whose own send waits behind its receive, so the
// schedule's order stays.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/lanes.h"

namespace tessera::parallel::pipeline {

// What the executor needs of one stage's model.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // The stage's layers on one micro-batch: its inputs on the first stage, the previous
  // stage's activation elsewhere.
  virtual Tensor forward(const Tensor& input) = 0;
  // On the last stage: the scalar loss of forward()'s output against the labels.
  virtual Tensor loss(const Tensor& output, const Tensor& labels) = 0;
  // Backpropagates `grad` from `root` (a forward output, or the loss); `last` marks the
  // batch's last backward on this stage (gradient reduction may start there).
  virtual void backward(const Tensor& root, const Tensor& grad, bool last) = 0;
  // A scalar loss term the latest forward() made besides its output, on a stage that does
  // not compute the loss (a mixture of experts' load-balancing losses); undefined when none.
  // The executor keeps it with its micro-batch for backward_with().
  virtual Tensor extra_loss() { return Tensor(); }
  // backward() that also backpropagates `extra` (an extra_loss(), when defined) from the
  // seed a loss gets, `loss_seed`, in the same pass.
  virtual void backward_with(const Tensor& root, const Tensor& grad, bool last, const Tensor& extra,
                             const Tensor& loss_seed);
  // Where activations live (the device of the stage's parameters).
  virtual Device device() const = 0;
};

// One micro-batch: the first stage reads `inputs`, the last stage `labels` (a stage may
// leave what it does not read undefined).
struct MicroBatch {
  Tensor inputs;
  Tensor labels;
};

// What the schedule's closing instructions do; an empty hook does nothing.
struct StepHooks {
  std::function<void()> reduce_tied_grads;  // ReduceTiedGrads
  std::function<void()> reduce_grads;       // ReduceGrads
  std::function<void()> optimizer_step;     // OptimizerStep
};

// Seconds of the last batch on this stage: busy in forward and backward, and in all (the
// StepHooks' reductions and optimizer step included); and how many of its receives had
// been started before the stage asked for their tensors (Note [Non-blocking stage
// transfers]; headers not counted).
struct PipelineTiming {
  double busy_s = 0;
  double total_s = 0;
  int receives_ahead = 0;
};

// Which stage-to-stage transfers are partitioned over `slices`, the tensor-parallel group
// (Note [Partitioned stage transfers]); nothing is partitioned without one of size > 1.
struct PartitionedTransfers {
  Communicator* slices = nullptr;
  bool activations = false;  // DeepSpeed's pipe_partitioned
  bool gradients = false;    // DeepSpeed's grad_partitioned
};

class PipelineExecutor {
 public:
  // `pipe`: the stages in order (rank s = stage s). pipe, stage and transfers.slices must
  // outlive the executor. `nonblocking`: Note [Non-blocking stage transfers].
  PipelineExecutor(Communicator& pipe, PipelineStage& stage, PartitionedTransfers transfers = {},
                   bool nonblocking = true);

  // One training batch through the 1F1B schedule; every stage passes the same number of
  // micro-batches. Returns the mean loss, equal on every stage. Gradients are accumulated
  // into the stage's parameters; the schedule's reductions and step run `hooks` (Note
  // [Pipeline executor]). Collective over the pipe group.
  double train_batch(const std::vector<MicroBatch>& micro_batches, const StepHooks& hooks = {});
  // The mean loss of a batch through the inference schedule, without gradients.
  double eval_batch(const std::vector<MicroBatch>& micro_batches);
  const PipelineTiming& last_timing() const { return timing_; }
  // Forgets the transfers' shapes, so the next batch's first messages carry new headers:
  // every stage calls it before the same batch when the micro-batches' shapes change (a
  // curriculum's sequence length; DeepSpeed's reset_activation_shape).
  void reset_shapes();

 private:
  // A receive started on a lane, not yet taken; `started_by` numbers the recv() call that
  // started it (the one that will take it, when it was not started ahead).
  struct Started {
    Tensor tensor;
    CommHandle handle;
    int64_t started_by = 0;
  };
  // A direction's tensor shape, learnt from the first message, whether its data moves in
  // tensor-parallel pieces, and its lane (Note [Pipe lanes]; null: the pipe group carries
  // it) with the receives started on it.
  struct Channel {
    bool partitioned = false;
    bool known = false;
    Shape shape;
    DType dtype = DType::f32;
    Lane* lane = nullptr;
    std::deque<Started> started;  // oldest first; the header's alone while the shape is unknown
    int unstarted = 0;            // of the batch's receives
  };
  // Sends t's data (started, when non-blocking: the handle says when it has gone).
  CommHandle send(const Tensor& t, int peer, Channel& channel);
  // The next tensor from `peer`, waited for.
  Tensor recv(int peer, Channel& channel);
  // A send and a waited-for receive on the channel's lane, else on pipe_ (through async_
  // when there is one).
  CommHandle send_now(const Tensor& t, int peer, Channel& channel);
  void recv_now(const Tensor& t, int peer);
  // Receiving on a lane: the batch will take `count` tensors on `channel`; starts the
  // first ones.
  void begin_receives(Channel& channel, int count);
  // Starts receives on the channel's lane until kReceivesAhead are not yet taken (only the
  // header's while the shape is unknown).
  void start_receives(Channel& channel);
  // Records the shape and dtype a header from `peer` announces.
  void read_header(const Tensor& header, int peer, Channel& channel);
  // The tensor a received piece of a partitioned transfer belongs to (Note [Partitioned
  // stage transfers]), or `t` itself.
  Tensor assemble(const Tensor& t, const Channel& channel);
  // Lanes, or pipe_'s async_: waits for every started operation.
  void wait_all();
  // After a failure inside a batch: cancels the lanes' operations (receives started ahead
  // may never be matched) and waits for what was started on pipe_, so that nothing of this
  // batch pairs with the peers' next one (its own errors are the failure's consequences).
  void drain() noexcept;
  // The step's loss on every stage: the stages' `loss_sum` (the last stage's losses) plus
  // `extra_sum` (an earlier stage's extra loss terms, f64 on the device; may be undefined),
  // summed over the pipe group, over `micro_batches`.
  double finish(double loss_sum, const Tensor& extra_sum, int micro_batches);

  Communicator& pipe_;
  std::unique_ptr<AsyncCollectives> async_;  // pipe_'s, when nonblocking without lanes
  PipeLanes lanes_;                          // when nonblocking and uses_lanes(pipe_)
  PipelineStage& stage_;
  Communicator* slices_;  // the tensor-parallel group of partitioned transfers
  Channel act_out_, act_in_, grad_out_, grad_in_;
  PipelineTiming timing_;
  int64_t recv_calls_ = 0;  // recv()s so far, numbering Started::started_by
};

}  // namespace tessera::parallel::pipeline
