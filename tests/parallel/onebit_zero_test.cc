// The 1-bit optimizers under ZeroOptimizer (Note [1-bit optimizers under ZeRO stage 0]):
// the compressed steps see the micro-batches' mean, not DeepSpeed's sum, so gradient
// accumulation does not change the step; every rank ends 1-bit Adam's compressed steps
// with the same parameters; ZeRO stages >= 1 are refused.
#include <catch2/catch.hpp>
#include <mutex>

#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/compression/onebit_config.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

constexpr int kSteps = 8;
constexpr int64_t kRowsPerRank = 6;  // per step
constexpr int64_t kT = 6;

GptConfig model_config() {
  GptConfig c;
  c.vocab_size = 23;
  c.block_size = kT;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.bias = false;  // the key bias gets rounding noise (tests/parallel/zero_optimizer_test.cc)
  return c;
}

optim::OptimizerConfig onebit_adam() {
  optim::OptimizerConfig o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  // Four full-precision steps: a variance frozen after fewer has entries near zero, and
  // m / (sqrt(v) + eps) then magnifies summation-order differences past any tolerance.
  OneBitOptions onebit;
  onebit.freeze_step = 5;
  return make_onebit_config(OneBitKind::adam, onebit, o);
}

// Rank r's rows of step s: (kRowsPerRank, kT + 1) tokens.
Tensor rows_of(int rank, int step) {
  Generator gen(static_cast<uint64_t>(100 + 10 * step + rank));
  const Tensor u = rand({kRowsPerRank, kT + 1}, gen, {DType::f64});
  std::vector<int32_t> ids;
  for (double v : u.to_vector<double>()) ids.push_back(static_cast<int32_t>(v * 23));
  return from_vector(ids, {kRowsPerRank, kT + 1});
}

// Trains kSteps on `world` ranks with `gas` micro-batches per step; every rank's final
// parameters.
std::vector<std::vector<float>> train(int world, int64_t gas) {
  std::vector<std::vector<float>> out(world);
  std::mutex mu;
  run_thread_ranks(world, [&](Communicator& comm) {
    Gpt model(model_config(), 99);
    const optim::OptimizerConfig o = onebit_adam();
    ZeroOptimizer zero(
        comm, model, optim::decay_groups(model.named_parameters(), o.lr, o.weight_decay, true, {}),
        o, ZeroConfig{});
    REQUIRE(zero.onebit() != nullptr);
    const int64_t micro = kRowsPerRank / gas;
    for (int s = 0; s < kSteps; ++s) {
      zero.zero_grad();
      const Tensor rows = rows_of(comm.rank(), s);
      for (int64_t m = 0; m < gas; ++m) {
        const Tensor r = rows.narrow(0, m * micro, micro);
        const Tensor x = r.narrow(1, 0, kT).contiguous(), y = r.narrow(1, 1, kT).contiguous();
        zero.backward(model.loss(model.forward(x), y), 1.0 / static_cast<double>(gas),
                      m == gas - 1);
      }
      zero.clip_grad_norm(0.0);
      zero.step();
    }
    std::vector<float> flat;
    for (const Tensor& p : model.parameters()) {
      for (float v : p.detach().to_vector<float>()) flat.push_back(v);
    }
    std::lock_guard<std::mutex> lock(mu);
    out[comm.rank()] = flat;
  });
  return out;
}

TEST_CASE("1-bit Adam's compressed steps take the micro-batches' mean under accumulation",
          "[onebit][zero]") {
  // At one rank, where the 1-bit all-reduce is the identity (at several, rounding
  // differences flip signs of near-zero momenta, so runs differ at the scale of the step):
  // accumulating 3 micro-batches of 2 rows is the step of one batch of 6 rows, up to
  // summation order. DeepSpeed's sum would triple the compressed steps' momentum input.
  const std::vector<std::vector<float>> one = train(1, 1);
  const std::vector<std::vector<float>> three = train(1, 3);
  CHECK(testing::relative_l2_error(three[0], one[0]) <= 1e-5);
}

TEST_CASE("every rank ends 1-bit Adam's compressed steps with the same parameters",
          "[onebit][zero]") {
  const std::vector<std::vector<float>> ranks = train(3, 2);
  CHECK(ranks[1] == ranks[0]);
  CHECK(ranks[2] == ranks[0]);
}

TEST_CASE("the 1-bit optimizers refuse ZeRO stages >= 1", "[onebit][zero]") {
  run_thread_ranks(1, [](Communicator& comm) {
    Gpt model(model_config(), 99);
    ZeroConfig z;
    z.stage = 1;
    CHECK_THROWS_WITH(
        ZeroOptimizer(comm, model,
                      optim::decay_groups(model.named_parameters(), 1e-3, 0.0, true, {}),
                      onebit_adam(), z),
        Catch::Contains("the 1-bit optimizers are not compatible with ZeRO (as in "
                        "DeepSpeed); expected stage 0, found stage 1"));
  });
}

}  // namespace
}  // namespace tessera::parallel
