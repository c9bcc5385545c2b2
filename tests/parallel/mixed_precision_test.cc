// ZeroOptimizer's mixed precision (Note [Mixed precision]) on the CPU: 16-bit parameters
// with f32 masters, the fp16 loss scale applied to backward and removed before the step,
// an overflow that skips the step and lowers the scale, and the masters in and out; and
// the loss-scale trajectory of tests/parallel/fp16_trajectory.h at stages 0-2 (the GPU kit
// runs the same on CUDA).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/module.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/half.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/parallel/fp16_trajectory.h"

namespace tessera::parallel {
namespace {

class Weights : public Module {
 public:
  explicit Weights(const std::vector<float>& values)
      : w(from_vector(values, {static_cast<int64_t>(values.size())})) {
    register_parameter("w", w);
  }
  Tensor w;  // (n)
};

// loss = sum(f32(w) * x): the gradient of w is x.
Tensor loss_of(const Weights& m, const std::vector<float>& x) {
  return sum(mul(cast(m.w, DType::f32), from_vector(x, {static_cast<int64_t>(x.size())})));
}

optim::OptimizerConfig sgd(double lr) {
  optim::OptimizerConfig o;
  o.type = optim::OptimizerType::sgd;
  o.lr = lr;
  return o;
}

std::vector<float> masters(ZeroOptimizer& opt) {
  return opt.whole_parameters().front().second.to_vector<float>();
}

std::vector<float> rounded_f16(const std::vector<float>& v) {
  std::vector<float> out;
  for (float f : v) out.push_back(static_cast<float>(Half(f)));
  return out;
}

struct Fixture {
  explicit Fixture(DType dtype, optim::LossScalerConfig scaler = {})
      : comms(make_thread_group(1)), model({0.1f, -0.2f, 0.3f, 0.7f, -1.1f}) {
    model.to(Device::cpu(), dtype);
    ZeroConfig zero;
    zero.stage = 2;
    opt = std::make_unique<ZeroOptimizer>(
        *comms[0], model, std::vector<optim::ParamGroup>{{model.named_parameters(), 0.25, 0.0}},
        sgd(0.25), zero, MixedPrecision(dtype, scaler));
  }
  // One step on `x`; returns whether the optimizer stepped.
  bool step(const std::vector<float>& x, double* norm = nullptr) {
    opt->zero_grad();
    opt->backward(loss_of(model, x), 1.0, true);
    const double n = opt->clip_grad_norm(0.0);
    if (norm) *norm = n;
    return opt->step();
  }
  std::vector<std::unique_ptr<Communicator>> comms;
  Weights model;
  std::unique_ptr<ZeroOptimizer> opt;
};

TEST_CASE("fp16: masters step in f32 from unscaled gradients; an overflow skips the step",
          "[zero][mixed]") {
  Fixture f(DType::f16, {.initial_scale_power = 4, .window = 1000, .hysteresis = 1});
  REQUIRE(f.model.w.dtype() == DType::f16);
  REQUIRE(f.opt->loss_scaler() != nullptr);
  CHECK(f.opt->loss_scaler()->scale() == 16.0);
  const std::vector<float> start = masters(*f.opt);
  CHECK(start == rounded_f16({0.1f, -0.2f, 0.3f, 0.7f, -1.1f}));

  // The gradient x arrives multiplied by 16 in fp16 and is divided again before the step.
  const std::vector<float> x = {1, 2, -3, 0.5f, 4};
  double norm = 0;
  REQUIRE(f.step(x, &norm));
  CHECK(norm == Approx(std::sqrt(1 + 4 + 9 + 0.25 + 16)).epsilon(1e-12));
  std::vector<float> want;
  for (size_t i = 0; i < x.size(); ++i) want.push_back(start[i] - 0.25f * x[i]);
  CHECK(masters(*f.opt) == want);  // exact: the gradients are exact in fp16 and f32
  CHECK(f.model.w.to_vector<float>() == rounded_f16(want));

  // 16 x 1e4 is beyond fp16's 65504: inf gradients, no step, the scale halves.
  REQUIRE_FALSE(f.step({1e4f, 0, 0, 0, 0}, &norm));
  CHECK_FALSE(std::isfinite(norm));
  CHECK(f.opt->loss_scaler()->scale() == 8.0);
  CHECK(masters(*f.opt) == want);
  CHECK(f.model.w.to_vector<float>() == rounded_f16(want));

  // At scale 8 the same small step goes through again.
  REQUIRE(f.step(x));
  for (size_t i = 0; i < x.size(); ++i) want[i] -= 0.25f * x[i];
  CHECK(masters(*f.opt) == want);
}

TEST_CASE("bf16: no loss scale; the model holds the masters rounded to bf16", "[zero][mixed]") {
  Fixture f(DType::bf16);
  CHECK(f.opt->loss_scaler() == nullptr);
  const std::vector<float> x = {0.3f, -0.7f, 1.9f, 2.5f, -0.1f};
  const std::vector<float> start = masters(*f.opt);
  REQUIRE(f.step(x));
  const std::vector<float> now = masters(*f.opt);
  const std::vector<float> model = f.model.w.to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    // bf16 gradients carry 8 bits: x[i] rounded, then the f32 step.
    const float g = static_cast<float>(BFloat16(x[i]));
    CHECK(now[i] == start[i] - 0.25f * g);
    CHECK(model[i] == static_cast<float>(BFloat16(now[i])));
  }
}

TEST_CASE("masters load whole f32 tensors and the model follows", "[zero][mixed]") {
  Fixture f(DType::f16);
  const std::vector<float> values = {0.123456f, 2.5f, -3.75f, 1e-3f, 7.0f};
  f.opt->load_parameters({{"w", from_vector(values, {5})}});
  CHECK(masters(*f.opt) == values);  // f32, not rounded
  CHECK(f.model.w.to_vector<float>() == rounded_f16(values));
  CHECK_THROWS_WITH(f.opt->load_parameters({{"w", from_vector(values, {5}).to(DType::f16)}}),
                    Catch::Contains("expected f32"));
}

TEST_CASE("16-bit parameters must match the configured precision", "[zero][mixed]") {
  auto comms = make_thread_group(1);
  Weights m({1, 2, 3});
  ZeroConfig zero;
  CHECK_THROWS_WITH(
      ZeroOptimizer(*comms[0], m, {{m.named_parameters(), 0.1, 0.0}}, sgd(0.1), zero,
                    MixedPrecision(DType::bf16)),
      Catch::Contains("[zero] parameter \"w\": expected a contiguous bf16 tensor on cpu"));
}

TEST_CASE("fp16 on the CPU: the loss scale trajectory and the f32 masters against AdamW",
          "[zero][mixed]") {
  testing::check_fp16_trajectory(Device::cpu());
}

}  // namespace
}  // namespace tessera::parallel
