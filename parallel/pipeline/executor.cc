#include "parallel/pipeline/executor.h"

#include <chrono>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "parallel/comm/flat_pieces.h"
#include "parallel/pipeline/schedule.h"

namespace tessera::parallel::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kMaxDims = 6;
constexpr int64_t kHeader = kMaxDims + 2;  // [ndim, dims..., dtype]

// Receives started on a lane and not yet taken, at most, besides the one being waited for
// (Note [Non-blocking stage transfers]): the next one travels while this one is used.
constexpr size_t kReceivesAhead = 1;

// What travels for one tensor of a channel: all of it, or this rank's piece of the flat
// tensor (Note [Partitioned stage transfers]).
Tensor receive_buffer(const Shape& shape, DType dtype, bool partitioned, const Communicator* slices,
                      Device device) {
  if (!partitioned) return empty(shape, {dtype, device});
  return empty({(numel_of(shape) + slices->size() - 1) / slices->size()}, {dtype, device});
}

bool is_receive(PipeOp op) { return op == PipeOp::recv_activation || op == PipeOp::recv_grad; }
bool is_send(PipeOp op) { return op == PipeOp::send_activation || op == PipeOp::send_grad; }

// Runs a step's instructions in their order, except, with `sends_first`, that a send goes
// ahead of the receives before it in the step (Note [Sends before receives]).
template <class F>
void run_step(const PipeStep& step, bool sends_first, F&& execute) {
  std::vector<const PipeInstruction*> receives;  // deferred, in order
  for (const PipeInstruction& in : step) {
    if (sends_first && is_receive(in.op)) {
      receives.push_back(&in);
      continue;
    }
    if (!is_send(in.op)) {
      for (const PipeInstruction* r : receives) execute(*r);
      receives.clear();
    }
    execute(in);
  }
  for (const PipeInstruction* r : receives) execute(*r);
}

// A stage's buffers: what each in-flight micro-batch needs between its instructions.
struct Buffers {
  std::vector<Tensor> inputs, outputs, labels, grads, losses, extras;
  explicit Buffers(int n) : inputs(n), outputs(n), labels(n), grads(n), losses(n), extras(n) {}
};

}  // namespace

void PipelineStage::backward_with(const Tensor& root, const Tensor& grad, bool last,
                                  const Tensor& extra, const Tensor& loss_seed) {
  TS_CHECK(!extra.defined(),
           "[pipeline] a stage with an extra loss term must backpropagate it "
           "(override backward_with); this one does not");
  (void)loss_seed;
  backward(root, grad, last);
}

PipelineExecutor::PipelineExecutor(Communicator& pipe, PipelineStage& stage,
                                   PartitionedTransfers transfers, bool nonblocking)
    : pipe_(pipe), stage_(stage), slices_(transfers.slices) {
  if (nonblocking && uses_lanes(pipe)) {
    lanes_ = make_pipe_lanes(pipe);
    const auto lane = [](Lane& l) { return l.exists() ? &l : nullptr; };
    act_out_.lane = lane(lanes_.activations_out);
    act_in_.lane = lane(lanes_.activations_in);
    grad_out_.lane = lane(lanes_.gradients_out);
    grad_in_.lane = lane(lanes_.gradients_in);
  } else if (nonblocking && pipe.size() > 1) {
    async_ = std::make_unique<AsyncCollectives>(pipe);
  }
  const bool split = slices_ != nullptr && slices_->size() > 1;
  act_out_.partitioned = act_in_.partitioned = split && transfers.activations;
  grad_out_.partitioned = grad_in_.partitioned = split && transfers.gradients;
}

CommHandle PipelineExecutor::send_now(const Tensor& t, int peer, Channel& channel) {
  if (channel.lane) return channel.lane->async->send(t, channel.lane->peer);
  if (async_) return async_->send(t, peer);
  pipe_.send(t, peer);
  return CommHandle();
}

void PipelineExecutor::wait_all() {
  if (async_) async_->wait_all();
  for (Lane* lane : lanes_.existing()) lane->async->wait_all();
  fold_lane_stats(lanes_, pipe_);
}

void PipelineExecutor::drain() noexcept {
  std::vector<AsyncCollectives*> started;
  if (async_) started.push_back(async_.get());
  for (Lane* lane : lanes_.existing()) {
    lane->group->cancel(str_cat("stage ", pipe_.rank(), " failed"));
    started.push_back(lane->async.get());
  }
  for (AsyncCollectives* async : started) {
    try {
      async->wait_all();
    } catch (...) {
    }
  }
  for (Channel* c : {&act_out_, &act_in_, &grad_out_, &grad_in_}) {
    c->started.clear();
    c->unstarted = 0;
  }
}

void PipelineExecutor::recv_now(const Tensor& t, int peer) {
  if (async_) {
    async_->recv(t, peer).wait();
  } else {
    pipe_.recv(t, peer);
  }
}

CommHandle PipelineExecutor::send(const Tensor& t, int peer, Channel& channel) {
  const Tensor data = t.detach().contiguous();
  if (!channel.known) {
    TS_CHECK(data.dim() <= kMaxDims, "[pipeline] stage ", pipe_.rank(), " sends a ", data.dim(),
             "-D tensor; expected at most ", kMaxDims, " dims");
    std::vector<int64_t> header(kHeader, 0);
    header[0] = data.dim();
    for (int64_t d = 0; d < data.dim(); ++d) header[1 + d] = data.size(d);
    header[kHeader - 1] = static_cast<int64_t>(data.dtype());
    send_now(from_vector(header, {kHeader}).to(stage_.device()), peer, channel);
    channel.known = true;
    channel.shape = data.shape();
    channel.dtype = data.dtype();
  }
  TS_CHECK(data.shape() == channel.shape && data.dtype() == channel.dtype, "[pipeline] stage ",
           pipe_.rank(), " sends ", shape_str(data.shape()), " ", dtype_name(data.dtype()),
           " to stage ", peer, "; expected the ", shape_str(channel.shape), " ",
           dtype_name(channel.dtype),
           " of its first message (shapes change only through reset_shapes())");
  if (!channel.partitioned) return send_now(data, peer, channel);
  // This rank's piece of the flat tensor (Note [Partitioned stage transfers]).
  return send_now(flat_piece(data, *slices_), peer, channel);
}

void PipelineExecutor::reset_shapes() {
  for (Channel* c : {&act_out_, &act_in_, &grad_out_, &grad_in_}) {
    TS_CHECK(c->started.empty(), "[pipeline] internal error: stage ", pipe_.rank(),
             " resets its shapes with receives started");
    c->known = false;
  }
}

void PipelineExecutor::read_header(const Tensor& header, int peer, Channel& channel) {
  const std::vector<int64_t> h = header.to(Device::cpu()).to_vector<int64_t>();
  TS_CHECK(h[0] >= 0 && h[0] <= kMaxDims, "[pipeline] stage ", pipe_.rank(),
           " received a header of ", h[0], " dims from stage ", peer, "; expected 0 to ", kMaxDims);
  channel.shape.assign(h.begin() + 1, h.begin() + 1 + h[0]);
  channel.dtype = static_cast<DType>(h[kHeader - 1]);
  channel.known = true;
}

Tensor PipelineExecutor::assemble(const Tensor& t, const Channel& channel) {
  return channel.partitioned ? gather_flat_pieces(t, channel.shape, *slices_) : t;
}

void PipelineExecutor::begin_receives(Channel& channel, int count) {
  if (!channel.lane) return;
  TS_CHECK(channel.started.empty(), "[pipeline] internal error: stage ", pipe_.rank(),
           " begins a batch with ", channel.started.size(), " receives of the last not taken");
  channel.unstarted = count;
  start_receives(channel);
}

void PipelineExecutor::start_receives(Channel& channel) {
  Lane& lane = *channel.lane;
  if (!channel.known) {
    if (channel.started.empty() && channel.unstarted > 0) {
      const Tensor header = zeros({kHeader}, {DType::i64, stage_.device()});
      channel.started.push_back({header, lane.async->recv(header, lane.peer), recv_calls_});
    }
    return;
  }
  while (channel.started.size() < kReceivesAhead && channel.unstarted > 0) {
    const Tensor t =
        receive_buffer(channel.shape, channel.dtype, channel.partitioned, slices_, stage_.device());
    channel.started.push_back({t, lane.async->recv(t, lane.peer), recv_calls_});
    --channel.unstarted;
  }
}

Tensor PipelineExecutor::recv(int peer, Channel& channel) {
  const int64_t call = ++recv_calls_;
  if (channel.lane) {
    if (!channel.known) {
      TS_CHECK(!channel.started.empty(), "[pipeline] internal error: stage ", pipe_.rank(),
               " takes more tensors from stage ", peer, " than its batch began receiving");
      const Started header = channel.started.front();
      channel.started.pop_front();
      header.handle.wait();
      read_header(header.tensor, peer, channel);
      start_receives(channel);
    }
    TS_CHECK(!channel.started.empty(), "[pipeline] internal error: stage ", pipe_.rank(),
             " takes more tensors from stage ", peer, " than its batch began receiving");
    const Started next = channel.started.front();
    channel.started.pop_front();
    if (next.started_by < call) ++timing_.receives_ahead;
    start_receives(channel);  // the one after travels while this one is used
    next.handle.wait();
    return assemble(next.tensor, channel);
  }
  if (!channel.known) {
    const Tensor header = zeros({kHeader}, {DType::i64, stage_.device()});
    recv_now(header, peer);
    read_header(header, peer, channel);
  }
  const Tensor t =
      receive_buffer(channel.shape, channel.dtype, channel.partitioned, slices_, stage_.device());
  recv_now(t, peer);
  return assemble(t, channel);
}

double PipelineExecutor::finish(double loss_sum, const Tensor& extra_sum, int micro_batches) {
  wait_all();  // the sends still travelling, and their errors
  if (extra_sum.defined()) loss_sum += extra_sum.to(Device::cpu()).item<double>();
  // The last stage's losses plus the earlier stages' extra loss terms (zero without any),
  // averaged over the micro-batches, on every stage: the loss one process reports.
  const Tensor mean =
      scalar_tensor(loss_sum / micro_batches, {DType::f64, stage_.device()}).view({1});
  pipe_.all_reduce(mean);
  return mean.to(Device::cpu()).to_vector<double>()[0];
}

double PipelineExecutor::train_batch(const std::vector<MicroBatch>& micro_batches,
                                     const StepHooks& hooks) {
  const auto start = Clock::now();
  timing_ = {};
  const int m = static_cast<int>(micro_batches.size());
  const int stages = pipe_.size(), s = pipe_.rank();
  const bool first = s == 0, last = s == stages - 1;
  const std::vector<PipeStep> schedule = train_schedule(m, stages, s);
  Buffers buf(train_buffers(m, stages, s));
  const Tensor grad_scale = scalar_tensor(1.0 / m, {DType::f32, stage_.device()});
  double loss_sum = 0.0;
  Tensor extra_sum;  // the earlier stages' extra loss terms, f64 on the device
  int backwards = 0;
  double loss = 0;
  try {
    follow_pipe_link(lanes_, pipe_);
    begin_receives(act_in_, first ? 0 : m);
    begin_receives(grad_in_, last ? 0 : m);
    const bool sends_first = lanes_.activations_out.exists() || lanes_.activations_in.exists();
    for (const PipeStep& step : schedule) {
      run_step(step, sends_first, [&](const PipeInstruction& in) {
        const int b = in.buffer;
        switch (in.op) {
          case PipeOp::load_micro_batch: {
            const MicroBatch& mb = micro_batches.at(in.micro_batch);
            if (first) buf.inputs[b] = mb.inputs;
            if (last) buf.labels[b] = mb.labels;
            break;
          }
          case PipeOp::recv_activation: {
            Tensor x = recv(s - 1, act_in_);
            x.set_requires_grad(true);  // its gradient goes back upstream
            buf.inputs[b] = x;
            break;
          }
          case PipeOp::forward: {
            const auto t0 = Clock::now();
            buf.outputs[b] = stage_.forward(buf.inputs[b]);
            if (last) {
              buf.losses[b] = stage_.loss(buf.outputs[b], buf.labels[b]);
              loss_sum += buf.losses[b].to(Device::cpu()).to(DType::f64).item<double>();
            } else if ((buf.extras[b] = stage_.extra_loss()).defined()) {
              // Summed on the device, read once at the end (reading each would wait for it).
              const Tensor v = buf.extras[b].detach().to(DType::f64);
              extra_sum = extra_sum.defined() ? add(extra_sum, v) : v;
            }
            timing_.busy_s += seconds_since(t0);
            break;
          }
          case PipeOp::send_activation:
            send(buf.outputs[b], s + 1, act_out_);  // kept: the root of its backward
            break;
          case PipeOp::recv_grad:
            buf.grads[b] = recv(s + 1, grad_in_);
            break;
          case PipeOp::backward: {
            const auto t0 = Clock::now();
            const bool final_backward = ++backwards == m;
            if (last) {
              stage_.backward(buf.losses[b], grad_scale.to(buf.losses[b].dtype()), final_backward);
            } else {
              stage_.backward_with(buf.outputs[b], buf.grads[b], final_backward, buf.extras[b],
                                   grad_scale);
            }
            buf.outputs[b] = buf.losses[b] = buf.grads[b] = buf.extras[b] = Tensor();
            timing_.busy_s += seconds_since(t0);
            break;
          }
          case PipeOp::send_grad: {
            const Tensor g = buf.inputs[b].grad();
            TS_CHECK(g.defined(), "[pipeline] stage ", s, " has no gradient for micro-batch ",
                     in.micro_batch, "'s input; expected the stage's output to depend on it");
            send(g, s - 1, grad_out_);
            buf.inputs[b] = Tensor();
            break;
          }
          case PipeOp::reduce_tied_grads:
            if (hooks.reduce_tied_grads) hooks.reduce_tied_grads();
            break;
          case PipeOp::reduce_grads:
            if (hooks.reduce_grads) hooks.reduce_grads();
            break;
          case PipeOp::optimizer_step:
            wait_all();  // Note [Non-blocking stage transfers]
            if (hooks.optimizer_step) hooks.optimizer_step();
            break;
        }
      });
    }
    loss = finish(loss_sum, extra_sum, m);
  } catch (...) {
    drain();
    throw;
  }
  timing_.total_s = seconds_since(start);
  return loss;
}

double PipelineExecutor::eval_batch(const std::vector<MicroBatch>& micro_batches) {
  NoGradGuard no_grad;
  const auto start = Clock::now();
  timing_ = {};
  const int m = static_cast<int>(micro_batches.size());
  const int stages = pipe_.size(), s = pipe_.rank();
  const bool first = s == 0, last = s == stages - 1;
  Buffers buf(2);
  double loss_sum = 0.0;
  std::vector<CommHandle> sent(2);  // per buffer: its output's send, waited for before reuse
  double loss = 0;
  try {
    follow_pipe_link(lanes_, pipe_);
    begin_receives(act_in_, first ? 0 : m);
    const bool sends_first = lanes_.activations_out.exists() || lanes_.activations_in.exists();
    for (const PipeStep& step : inference_schedule(m, stages, s)) {
      run_step(step, sends_first, [&](const PipeInstruction& in) {
        const int b = in.buffer;
        switch (in.op) {
          case PipeOp::load_micro_batch:
            if (first) buf.inputs[b] = micro_batches.at(in.micro_batch).inputs;
            if (last) buf.labels[b] = micro_batches.at(in.micro_batch).labels;
            break;
          case PipeOp::recv_activation:
            buf.inputs[b] = recv(s - 1, act_in_);
            break;
          case PipeOp::forward: {
            sent[b].wait();  // the buffer's last output has gone: it may be replaced
            const auto t0 = Clock::now();
            buf.outputs[b] = stage_.forward(buf.inputs[b]);
            if (last) {
              loss_sum += stage_.loss(buf.outputs[b], buf.labels[b])
                              .to(Device::cpu())
                              .to(DType::f64)
                              .item<double>();
            }
            timing_.busy_s += seconds_since(t0);
            break;
          }
          case PipeOp::send_activation:
            sent[b] = send(buf.outputs[b], s + 1, act_out_);
            break;
          default:
            TS_FAIL("[pipeline] internal error: ", to_string(in), " in an inference schedule");
        }
      });
    }
    loss = finish(loss_sum, Tensor(), m);
  } catch (...) {
    drain();
    throw;
  }
  timing_.total_s = seconds_since(start);
  return loss;
}

}  // namespace tessera::parallel::pipeline
