// The fp16 loss-scale trajectory of fp16_trajectory.h.
#include "tests/parallel/fp16_trajectory.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/module.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "optim/config.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::parallel::testing {
namespace {

constexpr int64_t kRows = 23, kCols = 19, kBias = 31;  // 468 parameters, no power of two

// A weight matrix (decayed) and a bias vector (not decayed: two parameter groups).
class Weights : public Module {
 public:
  Weights() : w(values(kRows * kCols, 0).view({kRows, kCols})), b(values(kBias, 1)) {
    register_parameter("w", w);
    register_parameter("b", b);
  }
  Tensor w;  // (23, 19)
  Tensor b;  // (31)

 private:
  // Starting values in [-1, 1), different per parameter.
  static Tensor values(int64_t n, uint64_t seed) {
    Generator g(seed);
    return rand({n}, g, {DType::f32}, -1.0, 1.0);
  }
};

// The gradients of one step, flat over (w, b): small multiples of 2^-11, exact in fp16 after
// any power-of-two loss scale up to 2^22, so the device's unscaled gradient is exactly this.
// They are of the order of Adam's eps below, which makes the update depend on their size.
std::vector<float> gradients(int step) {
  std::vector<float> g(static_cast<size_t>(kRows * kCols + kBias));
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(static_cast<int64_t>((7 * i + 3 * step) % 31) - 15) / 2048.0f;
  }
  return g;
}

// loss = sum(f32(w) * xw) + sum(f32(b) * xb): the gradient of (w, b) is x.
Tensor loss_of(const Weights& m, const std::vector<float>& x) {
  const int64_t nw = kRows * kCols;
  const Tensor xw = from_vector(std::vector<float>(x.begin(), x.begin() + nw), {kRows, kCols});
  const Tensor xb = from_vector(std::vector<float>(x.begin() + nw, x.end()), {kBias});
  return add(sum(mul(cast(m.w, DType::f32), xw.to(m.w.device()))),
             sum(mul(cast(m.b, DType::f32), xb.to(m.b.device()))));
}

// AdamW whose eps (1e-3) is of the gradients' size: Adam is otherwise invariant to the
// gradient's scale, and a step from gradients still carrying the loss scale (or divided by
// it twice) would look right.
optim::OptimizerConfig adamw() {
  optim::OptimizerConfig o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.adam.eps = 1e-3;
  return o;
}

std::vector<optim::ParamGroup> groups_of(const Module& m) {
  return optim::decay_groups(m.named_parameters(), adamw().lr, adamw().weight_decay, true, {});
}

// The f32 masters, flat over (w, b), on the CPU (whole_parameters() gathers sharded masters
// into host tensors, so their device is not checked).
std::vector<float> masters(ZeroOptimizer& opt) {
  std::vector<float> out;
  const StateDict whole = opt.whole_parameters();
  REQUIRE(whole.size() == 2);
  for (const char* name : {"w", "b"}) {
    for (const auto& [n, t] : whole) {
      if (n != name) continue;
      REQUIRE(t.dtype() == DType::f32);
      const std::vector<float> v = t.to_vector<float>();
      out.insert(out.end(), v.begin(), v.end());
    }
  }
  REQUIRE(out.size() == static_cast<size_t>(kRows * kCols + kBias));
  return out;
}

// The fp16 model's parameters, flat over (w, b), as f32 on the CPU.
std::vector<float> model_values(const Weights& m) {
  std::vector<float> out = m.w.to_vector<float>();
  const std::vector<float> b = m.b.to_vector<float>();
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// `v` rounded to fp16 by the CPU's conversion.
std::vector<float> rounded_f16(const std::vector<float>& v) {
  return from_vector(v).to(DType::f16).to_vector<float>();
}

// The reference: the same AdamW on f32 CPU parameters with the exact (unscaled) gradients.
class Reference {
 public:
  explicit Reference(const std::vector<float>& start) {
    const int64_t nw = kRows * kCols;
    w_ = from_vector(std::vector<float>(start.begin(), start.begin() + nw), {kRows, kCols});
    b_ = from_vector(std::vector<float>(start.begin() + nw, start.end()), {kBias});
    w_.set_requires_grad(true);
    b_.set_requires_grad(true);
    opt_ = optim::make_optimizer(adamw(),
                                 optim::decay_groups({{"w", w_, {}}, {"b", b_, {}}}, adamw().lr,
                                                     adamw().weight_decay, true, {}));
  }
  void step(const std::vector<float>& g) {
    const int64_t nw = kRows * kCols;
    w_.set_grad(from_vector(std::vector<float>(g.begin(), g.begin() + nw), {kRows, kCols}));
    b_.set_grad(from_vector(std::vector<float>(g.begin() + nw, g.end()), {kBias}));
    opt_->step();
  }
  std::vector<float> values() const {
    std::vector<float> out = w_.detach().to_vector<float>();
    const std::vector<float> b = b_.detach().to_vector<float>();
    out.insert(out.end(), b.begin(), b.end());
    return out;
  }

 private:
  Tensor w_, b_;
  std::unique_ptr<optim::Optimizer> opt_;
};

// |got - want| <= 1e-6 (1 + |want|) everywhere: the same f32 AdamW arithmetic in the same
// order on both sides, up to contraction into FMAs.
void check_masters(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= 1e-6 * (1.0 + std::abs(want[i]))) && bad++ == 0) first = i;
  }
  INFO(bad << " of " << got.size() << " masters differ; first at " << first << ": got "
           << got[first] << ", want " << want[first]);
  CHECK(bad == 0);
}

}  // namespace

void check_fp16_trajectory(Device device) {
  for (int stage = 0; stage <= 2; ++stage) {
    DYNAMIC_SECTION("stage " << stage) {
      const auto comms = make_thread_group(1);  // a group of one moves no data
      Weights model;
      model.to(device, DType::f16);
      REQUIRE(model.w.dtype() == DType::f16);
      REQUIRE(model.w.device() == device);
      ZeroConfig zero;
      zero.stage = stage;
      // Scale 2^10; one overflow is absorbed by the hysteresis, the next halves the scale;
      // 3 good steps after an overflow double it and refill the hysteresis.
      const optim::LossScalerConfig scaler{
          .initial_scale_power = 10, .window = 3, .hysteresis = 2, .min_scale = 1.0};
      ZeroOptimizer opt(*comms[0], model, groups_of(model), adamw(), zero,
                        MixedPrecision(DType::f16, scaler));
      REQUIRE(opt.loss_scaler() != nullptr);
      CHECK(opt.loss_scaler()->scale() == 1024.0);

      // The masters start as the fp16 model's values, and the reference from them.
      const std::vector<float> start = masters(opt);
      CHECK(model_values(model) == start);
      CHECK(rounded_f16(start) == start);
      Reference ref(start);

      // One step: gradients `x`, or an overflow when `overflow` (one gradient of 1e4, which
      // times the scale is beyond fp16's 65504). Returns whether the optimizer stepped.
      double norm = 0.0;
      auto step = [&](int s, bool overflow) {
        std::vector<float> x = gradients(s);
        if (overflow) x[kRows * kCols + 5] = 1e4f;
        opt.zero_grad();
        opt.backward(loss_of(model, x), 1.0, /*boundary=*/true);
        norm = opt.clip_grad_norm(0.0);
        return opt.step();
      };
      // A good step: stepped, the unscaled gradient norm, masters as the reference's, and
      // the fp16 model holding the masters rounded.
      auto good = [&](int s, double scale_after) {
        INFO("good step " << s);
        REQUIRE(step(s, false));
        double sq = 0.0;
        for (float g : gradients(s)) sq += static_cast<double>(g) * g;
        CHECK(norm == Approx(std::sqrt(sq)).epsilon(1e-5));
        ref.step(gradients(s));
        const std::vector<float> now = masters(opt);
        check_masters(now, ref.values());
        CHECK(model_values(model) == rounded_f16(now));
        CHECK(opt.loss_scaler()->scale() == scale_after);
      };
      // An overflow: not stepped, an infinite or NaN norm, masters and model unchanged.
      auto skipped = [&](int s, double scale_after) {
        INFO("overflow step " << s);
        const std::vector<float> before = masters(opt);
        const int64_t steps = opt.step_count();
        REQUIRE_FALSE(step(s, true));
        CHECK_FALSE(std::isfinite(norm));
        CHECK(masters(opt) == before);
        CHECK(model_values(model) == rounded_f16(before));
        CHECK(opt.step_count() == steps);
        CHECK(opt.loss_scaler()->scale() == scale_after);
      };

      good(0, 1024.0);
      skipped(1, 1024.0);  // hysteresis 2 -> 1, scale kept
      skipped(2, 512.0);   // hysteresis spent: the scale halves
      good(3, 512.0);
      good(4, 512.0);
      good(5, 1024.0);     // 3 good steps since the overflow: doubled, hysteresis refilled
      skipped(6, 1024.0);  // the refilled hysteresis absorbs this one
      good(7, 1024.0);
      CHECK(opt.step_count() == 5);
      const optim::LossScalerState& st = opt.loss_scaler()->state();
      CHECK(st.iteration == 8);
      CHECK(st.last_overflow_iteration == 6);
      CHECK(st.hysteresis_left == 1);
    }
  }
}

}  // namespace tessera::parallel::testing
