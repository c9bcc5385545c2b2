// Partitioned stage transfers (Note [Partitioned stage transfers] in
// parallel/pipeline/executor.h) with a tensor that does not split evenly: 7 values over 3
// tensor-parallel ranks go as pieces of 3, 3 and 1 (zero-padded) and arrive whole. And
// non-blocking transfers (Note [Non-blocking stage transfers]) give the blocking bits.
#include "parallel/pipeline/executor.h"

#include <catch2/catch.hpp>
#include <mutex>
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
  explicit ScaleStage(int stage) {
    std::vector<float> w(kValues);
    for (int i = 0; i < kValues; ++i) w[i] = static_cast<float>(i + 1 + stage);
    w_ = from_vector(w, {1, kValues});
    w_.set_requires_grad(true);
  }
  Tensor forward(const Tensor& input) override { return mul(input, w_); }
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
};

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
    std::vector<parallel::pipeline::MicroBatch> batches;
    for (int k = 0; k < 2; ++k) {
      std::vector<float> x(kValues), y(kValues);
      for (int i = 0; i < kValues; ++i) {
        x[i] = 0.5f * static_cast<float>(i - k);
        y[i] = static_cast<float>((i * 3 + k) % 5) - 2.0f;
      }
      batches.push_back({from_vector(x, {1, kValues}), from_vector(y, {1, kValues})});
    }
    Outcome o;
    o.loss = executor.train_batch(batches);
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

}  // namespace
}  // namespace tessera
