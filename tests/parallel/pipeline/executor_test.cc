// Partitioned stage transfers (Note [Partitioned stage transfers] in
// parallel/pipeline/executor.h) with a tensor that does not split evenly: 7 values over 3
// tensor-parallel ranks go as pieces of 3, 3 and 1 (zero-padded) and arrive whole. And
// non-blocking transfers (Note [Non-blocking stage transfers]) give the blocking bits.
#include "parallel/pipeline/executor.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "core/factories.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/topology.h"

namespace tessera {
namespace {

constexpr int kValues = 7;

// y = x * w elementwise over (1, 7), w = [1, 2, ..., 7] + stage; the last stage's loss is
// sum(y * labels).
class ScaleStage : public parallel::pipeline::PipelineStage {
 public:
  // `fail_at`: the forward() call (from 0) that throws; -1: none.
  explicit ScaleStage(int stage, int fail_at = -1) : fail_at_(fail_at) {
    std::vector<float> w(kValues);
    for (int i = 0; i < kValues; ++i) w[i] = static_cast<float>(i + 1 + stage);
    w_ = from_vector(w, {1, kValues});
    w_.set_requires_grad(true);
  }
  Tensor forward(const Tensor& input) override {
    TS_CHECK(forwards_++ != fail_at_, "forward ", fail_at_, " fails on purpose");
    return mul(input, w_);
  }
  Tensor loss(const Tensor& output, const Tensor& labels) override {
    return sum(mul(output, labels));
  }
  void backward(const Tensor& root, const Tensor& grad, bool) override {
    tessera::backward(root, grad);
  }
  Device device() const override { return Device::cpu(); }
  const Tensor& weight() const { return w_; }

 private:
  Tensor w_;
  int fail_at_;
  int forwards_ = 0;
};

// `micro_batches` inputs and labels of (1, 7) for batch `batch`.
std::vector<parallel::pipeline::MicroBatch> make_batches(int micro_batches, int batch = 0) {
  std::vector<parallel::pipeline::MicroBatch> batches;
  for (int k = 0; k < micro_batches; ++k) {
    std::vector<float> x(kValues), y(kValues);
    for (int i = 0; i < kValues; ++i) {
      x[i] = 0.5f * static_cast<float>(i - k - batch);
      y[i] = static_cast<float>((i * 3 + k + batch) % 5) - 2.0f;
    }
    batches.push_back({from_vector(x, {1, kValues}), from_vector(y, {1, kValues})});
  }
  return batches;
}

struct Outcome {
  double loss = 0;
  std::vector<float> grad;
  int64_t pipe_bytes = 0;
};

// Every rank of (pipe, data, model) = (2, 1, 3) through 2 micro-batches, behind `link`.
std::vector<Outcome> run(bool partitioned, bool nonblocking = true,
                         const parallel::SimulatedLink& link = {}) {
  const parallel::ProcessGrid grid(2, 1, 3);
  std::vector<Outcome> out(grid.world_size());
  std::mutex mutex;
  parallel::run_thread_ranks(grid.world_size(), [&](parallel::Communicator& world) {
    parallel::ParallelGroups g = parallel::make_parallel_groups(world, grid);
    g.pipe->set_simulated_link(link);
    ScaleStage stage(g.coord.pipe);
    parallel::pipeline::PipelineExecutor executor(
        *g.pipe, stage, {g.model.get(), partitioned, partitioned}, nonblocking);
    Outcome o;
    o.loss = executor.train_batch(make_batches(2));
    o.grad = stage.weight().grad().to_vector<float>();
    o.pipe_bytes = g.pipe->stats().total_bytes_sent();
    std::lock_guard<std::mutex> lock(mutex);
    out[world.rank()] = o;
  });
  return out;
}

TEST_CASE("partitioned transfers of a tensor that does not split evenly arrive whole",
          "[pipeline]") {
  const std::vector<Outcome> whole = run(false);
  const std::vector<Outcome> pieces = run(true);
  for (size_t r = 0; r < whole.size(); ++r) {
    INFO("rank " << r);
    CHECK(pieces[r].loss == whole[r].loss);
    CHECK(pieces[r].grad == whole[r].grad);
    // 2 activations and 2 gradients of 7 f32 each way sent whole, or as a piece of 3.
    CHECK(whole[r].pipe_bytes - pieces[r].pipe_bytes == 2 * (7 - 3) * 4);
  }
  // Stage 1's weight gradient is the received x * w0 times the labels, averaged over the
  // micro-batches: element 6 needs the padded last piece.
  CHECK(whole[3].grad[6] == Approx((3.0 * 7 * 1 + 2.5 * 7 * 2) / 2));
}

TEST_CASE("non-blocking stage transfers give the blocking executor's bits", "[pipeline]") {
  // A slow link keeps each send travelling while its stage goes on.
  const parallel::SimulatedLink slow{.gbit_per_s = 0.001, .latency_us = 2000};
  for (const bool partitioned : {false, true}) {
    const std::vector<Outcome> blocking = run(partitioned, false, slow);
    const std::vector<Outcome> nonblocking = run(partitioned, true, slow);
    for (size_t r = 0; r < blocking.size(); ++r) {
      INFO("rank " << r << ", partitioned " << partitioned);
      CHECK(nonblocking[r].loss == blocking[r].loss);
      CHECK(nonblocking[r].grad == blocking[r].grad);
      CHECK(nonblocking[r].pipe_bytes == blocking[r].pipe_bytes);
    }
  }
}

// Per rank of a 4-stage pipe through two batches of 4 micro-batches: the losses, the
// weight's gradient and PipelineTiming::receives_ahead of each batch.
struct TwoBatches {
  std::vector<double> losses;
  std::vector<float> grad;
  std::vector<int> ahead;
};

std::vector<TwoBatches> run_two_batches(bool nonblocking) {
  std::vector<TwoBatches> out(4);
  parallel::run_thread_ranks(4, [&](parallel::Communicator& pipe) {
    ScaleStage stage(pipe.rank());
    parallel::pipeline::PipelineExecutor executor(pipe, stage, {}, nonblocking);
    TwoBatches& o = out[pipe.rank()];  // each rank writes its own
    for (int batch = 0; batch < 2; ++batch) {
      o.losses.push_back(executor.train_batch(make_batches(4, batch)));
      o.ahead.push_back(executor.last_timing().receives_ahead);
    }
    o.grad = stage.weight().grad().to_vector<float>();
  });
  return out;
}

TEST_CASE("receives are started ahead on the lanes and give the blocking bits", "[pipeline]") {
  // Note [Pipe lanes]: each stage receives 4 tensors per direction and batch. The first
  // batch's first tensor waits for its header; every other was started before it was asked
  // for. Stages 1 and 2 receive both ways.
  const std::vector<TwoBatches> blocking = run_two_batches(false);
  const std::vector<TwoBatches> ahead = run_two_batches(true);
  const std::vector<std::vector<int>> expected = {{3, 4}, {6, 8}, {6, 8}, {3, 4}};
  for (int r = 0; r < 4; ++r) {
    INFO("stage " << r);
    CHECK(ahead[r].losses == blocking[r].losses);
    CHECK(ahead[r].grad == blocking[r].grad);
    CHECK(blocking[r].ahead == std::vector<int>{0, 0});
    CHECK(ahead[r].ahead == expected[r]);
  }
}

TEST_CASE("a failing stage cancels its receives started ahead instead of waiting for them",
          "[pipeline]") {
  // Stage 1 fails in its first forward with receives started for micro-batches 1 and 2;
  // stage 0 sends micro-batch 2 only after micro-batch 0's gradient, which never comes.
  // Without cancelling them stage 1 would wait for the 6 s timeout before reporting.
  std::vector<std::string> errors(2);
  std::vector<double> seconds(2);
  parallel::run_thread_ranks(
      2,
      [&](parallel::Communicator& pipe) {
        ScaleStage stage(pipe.rank(), pipe.rank() == 1 ? 0 : -1);
        parallel::pipeline::PipelineExecutor executor(pipe, stage);
        const auto start = std::chrono::steady_clock::now();
        try {
          executor.train_batch(make_batches(4));
        } catch (const Error& e) {
          errors[pipe.rank()] = e.what();
        }
        seconds[pipe.rank()] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      parallel::CommOptions{.timeout = std::chrono::seconds(6)});
  CHECK_THAT(errors[1], Catch::Contains("forward 0 fails on purpose"));
  CHECK(seconds[1] < 3.0);
  CHECK_THAT(errors[0], Catch::Contains("timed out"));
}

}  // namespace
}  // namespace tessera
