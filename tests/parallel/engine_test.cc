// The engine on a model that is not a language model: a linear regression through the
// TrainableModel interface. One step over two micro-batches equals the SGD step on the mean
// of their losses computed by hand in f64; the engine refuses what the model cannot do and
// a batch of the wrong size, naming what it expected.
#include "parallel/engine/engine.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "core/factories.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using testing::error_of;

// y = x w, loss = mean((y - t)^2); x (B, 2), w (2, 1), t (B, 1).
class Regression final : public TrainableModel {
 public:
  Regression() : w_(from_vector<float>({0.5f, -1.0f}, {2, 1})) { register_parameter("w", w_); }
  Tensor forward(const Tensor& x) const override { return matmul(x, w_); }
  Tensor loss(const Tensor& y, const Tensor& t) const override {
    const Tensor d = sub(y, t);
    return mean(mul(d, d));
  }
  DropoutStreams& dropout_streams() override { return streams_; }
  void set_activation_checkpointing(int64_t, CheckpointPolicy) override {}
  const Tensor& w() const { return w_; }

 private:
  Tensor w_;
  DropoutStreams streams_{7, "dropout", 0};
};

EngineConfig sgd_config(int64_t gas, double lr) {
  EngineConfig c;
  c.optimizer.type = optim::OptimizerType::sgd;
  c.optimizer.lr = lr;
  c.batch.gradient_accumulation_steps = gas;
  return c;
}

std::vector<pipeline::MicroBatch> batches() {
  return {{from_vector<float>({1, 2, 3, 4}, {2, 2}), from_vector<float>({1, 0}, {2, 1})},
          {from_vector<float>({0, 1, 2, -1}, {2, 2}), from_vector<float>({2, 1}, {2, 1})}};
}

TEST_CASE("a step of the engine is SGD on the mean of its micro-batches' losses", "[engine]") {
  const double lr = 0.05;
  // By hand, in f64: loss_m = mean_i (x_i . w - t_i)^2, d loss_m / dw = 2/B sum_i r_i x_i.
  double w[2] = {0.5, -1.0}, grad[2] = {0, 0}, want_loss = 0;
  for (const pipeline::MicroBatch& b : batches()) {
    const std::vector<float> x = b.inputs.to_vector<float>(), t = b.labels.to_vector<float>();
    for (int i = 0; i < 2; ++i) {
      const double r = x[2 * i] * w[0] + x[2 * i + 1] * w[1] - t[i];
      want_loss += r * r / 2 / 2;  // mean over 2 rows, then over 2 micro-batches
      for (int j = 0; j < 2; ++j) grad[j] += 2.0 * r * x[2 * i + j] / 2 / 2;
    }
  }
  Regression model;
  const auto one = make_thread_group(1);
  Engine engine(sgd_config(2, lr), model,
                optim::decay_groups(model.named_parameters(), lr, 0.0, false, {}), Device::cpu(),
                *one[0]);
  const StepStats s = engine.train_batch(batches());
  CHECK(s.loss == Approx(want_loss).epsilon(1e-6));
  CHECK(s.grad_norm == Approx(std::hypot(grad[0], grad[1])).epsilon(1e-6));
  CHECK(s.lr == lr);
  CHECK_FALSE(s.skipped);
  CHECK(engine.global_steps() == 1);
  const std::vector<float> got = model.w().to_vector<float>();
  CHECK(got[0] == Approx(w[0] - lr * grad[0]).epsilon(1e-6));
  CHECK(got[1] == Approx(w[1] - lr * grad[1]).epsilon(1e-6));
  // Evaluation: the mean loss without a step.
  const double eval = engine.eval_batch(batches());
  CHECK(engine.global_steps() == 1);
  CHECK(model.w().to_vector<float>() == got);
  CHECK(eval > 0);
}

TEST_CASE("save_state and load_state carry a step to another engine", "[engine]") {
  const auto one = make_thread_group(1);
  Regression a, b;
  Engine first(sgd_config(2, 0.05), a,
               optim::decay_groups(a.named_parameters(), 0.05, 0.0, false, {}), Device::cpu(),
               *one[0]);
  first.train_batch(batches());
  const EngineCheckpoint saved = first.save_state();
  EngineCounters counters;
  counters.step = first.global_steps();
  counters.scheduler_last_batch_iteration = 0;
  counters.grid = nlohmann::json{1, 1, 1};
  Engine second(sgd_config(2, 0.05), b,
                optim::decay_groups(b.named_parameters(), 0.05, 0.0, false, {}), Device::cpu(),
                *one[0]);
  second.load_state(saved, counters);
  CHECK(second.global_steps() == 1);
  CHECK(b.w().to_vector<float>() == a.w().to_vector<float>());
  // The next steps agree bit for bit.
  CHECK(first.train_batch(batches()).loss == second.train_batch(batches()).loss);
  CHECK(b.w().to_vector<float>() == a.w().to_vector<float>());

  // A whole checkpoint with a tensor the model does not have was saved by another model.
  EngineCheckpoint extra = saved;
  extra.model.emplace_back("bias", zeros({1}));
  CHECK(error_of([&] { second.load_state(extra, counters); }) ==
        "[checkpoint] unexpected weights \"bias\"; expected only the model's parameters");
}

TEST_CASE("the engine refuses a batch of the wrong size and modes the model lacks", "[engine]") {
  Regression model;
  const auto one = make_thread_group(1);
  Engine engine(sgd_config(3, 0.1), model,
                optim::decay_groups(model.named_parameters(), 0.1, 0.0, false, {}), Device::cpu(),
                *one[0]);
  CHECK(error_of([&] { engine.train_batch(batches()); }) ==
        "[engine] train_batch: expected 3 micro-batches (gradient_accumulation_steps), found 2");

  std::vector<std::string> errors(2);
  run_thread_ranks(2, [&](Communicator& world) {
    ParallelGroups g = make_parallel_groups(world, ProcessGrid(2, 1, 1));
    Regression m;
    EngineConfig c = sgd_config(1, 0.1);
    c.pipeline.stages = 2;
    errors[world.rank()] = error_of([&] {
      Engine e(c, m, optim::decay_groups(m.named_parameters(), 0.1, 0.0, false, {}), Device::cpu(),
               *g.data, &g);
    });
  });
  for (const std::string& e : errors) {
    CHECK(e ==
          "[engine] 2 pipeline stages: expected a model that can be split into stages, found "
          "one that cannot");
  }
}

}  // namespace
}  // namespace tessera::parallel
