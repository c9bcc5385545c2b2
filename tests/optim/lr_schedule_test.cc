// LR schedules against values worked out by hand from DeepSpeed's formulas
// (deepspeed/runtime/lr_schedules.py), at t in {-1, 0, 1, W'-1, W', T} and around cycles.
#include "optim/lr_schedule.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/error.h"

namespace tessera::optim {
namespace {

TEST_CASE("WarmupLR: log and linear warmup, W' = max(2, W)", "[lr]") {
  WarmupLR log_w({0.0, 1e-3, 10, WarmupType::log});
  CHECK(log_w.lr_at(-1) == 0.0);
  CHECK(log_w.lr_at(0) == 0.0);  // ln(1) / ln(10)
  CHECK(log_w.lr_at(1) == Approx(std::log(2.0) / std::log(10.0) * 1e-3));
  CHECK(log_w.lr_at(9) == Approx(1e-3));  // ln(10) / ln(10)
  CHECK(log_w.lr_at(10) == 1e-3);
  CHECK(log_w.lr_at(1000) == 1e-3);

  WarmupLR lin({1e-4, 1e-3, 10, WarmupType::linear});
  CHECK(lin.lr_at(-1) == 1e-4);
  CHECK(lin.lr_at(5) == Approx(1e-4 + 0.5 * 9e-4));

  WarmupLR short_w({0.0, 1.0, 1, WarmupType::log});  // W' = 2
  CHECK(short_w.lr_at(0) == 0.0);
  CHECK(short_w.lr_at(1) == Approx(1.0));
}

TEST_CASE("WarmupDecayLR: linear decay to zero after warmup", "[lr]") {
  WarmupDecayLR s({0.0, 1.0, 10, WarmupType::linear}, 20);
  CHECK(s.lr_at(5) == Approx(0.5));
  CHECK(s.lr_at(10) == Approx(1.0));  // (20 - 10) / (20 - 10)
  CHECK(s.lr_at(15) == Approx(0.5));
  CHECK(s.lr_at(20) == 0.0);
  CHECK(s.lr_at(25) == 0.0);  // clamped at zero
}

TEST_CASE("WarmupCosineLR scales the optimizer's lr", "[lr]") {
  WarmupCosineLR s({20, 0.0, 10, 1e-4, WarmupType::log}, 2.0);
  CHECK(s.lr_at(-1) == 0.0);
  CHECK(s.lr_at(0) == 0.0);
  CHECK(s.lr_at(9) == Approx(2.0));
  CHECK(s.lr_at(10) ==
        Approx(2.0 * 0.9755307053217621).epsilon(1e-12));  // progress 1/10 into the cosine
  CHECK(s.lr_at(19) == Approx(2.0 * 1e-4));                // the end: cos(pi)
  WarmupCosineLR floor_ratio({20, 0.25, 10, 1e-4, WarmupType::linear}, 1.0);
  CHECK(floor_ratio.lr_at(0) == Approx(0.25));
  CHECK(floor_ratio.lr_at(4) == Approx(0.25 + 0.75 * 0.4));
  REQUIRE_THROWS_WITH(WarmupCosineLR({5, 0.0, 10, 1e-4, WarmupType::log}, 1.0),
                      Catch::Contains("[WarmupCosineLR] expected total_num_steps > "
                                      "warmup_num_steps (10), found 5"));
}

TEST_CASE("OneCycle: triangular lr and momentum, then decay", "[lr]") {
  OneCycleParams p;
  p.cycle_min_lr = 0.1;
  p.cycle_max_lr = 1.0;
  p.cycle_first_step_size = 4;  // second defaults to 4: total 8, ratio 0.5
  OneCycle s(p);
  CHECK(s.lr_at(-1) == Approx(0.1));
  CHECK(*s.beta1_at(-1) == Approx(0.9));
  CHECK(s.lr_at(1) == Approx(0.55));  // x = 0.25: scale 0.5
  CHECK(*s.beta1_at(1) == Approx(0.85));
  CHECK(s.lr_at(3) == Approx(1.0));  // the peak at x = ratio
  CHECK(*s.beta1_at(3) == Approx(0.8));
  CHECK(s.lr_at(5) == Approx(0.55));  // x = 0.75: scale (0.75 - 1) / (0.5 - 1)
  CHECK(s.lr_at(7) == Approx(0.1));
  CHECK(s.lr_at(8) == Approx(0.1));  // decay off: stays at min
  CHECK(*s.beta1_at(8) == Approx(0.9));

  p.decay_lr_rate = 0.5;
  p.decay_step_size = 2;
  p.decay_mom_rate = 0.1;
  OneCycle d(p);
  CHECK(d.lr_at(9) == Approx(0.1 / 1.5));  // interval (9 - 8 + 1) / 2 = 1
  CHECK(*d.beta1_at(9) == Approx(0.99));
  p.cycle_momentum = false;
  CHECK_FALSE(OneCycle(p).beta1_at(0).has_value());
}

TEST_CASE("LRRangeTest: continuous and staircase", "[lr]") {
  LRRangeTest cont({1e-3, 10, 1.0, false});
  CHECK(cont.lr_at(-1) == Approx(1e-3));
  CHECK(cont.lr_at(4) == Approx(1.5e-3));
  LRRangeTest stairs({1e-3, 10, 1.0, true});
  CHECK(stairs.lr_at(4) == Approx(1e-3));
  CHECK(stairs.lr_at(9) == Approx(2e-3));
}

TEST_CASE("LrScheduler starts at t = -1 and steps once per optimizer step", "[lr]") {
  LrScheduler s(std::make_unique<WarmupLR>(WarmupParams{0.0, 1.0, 10, WarmupType::linear}));
  CHECK(s.last_batch_iteration() == -1);
  CHECK(s.lr() == 0.0);
  s.step();  // the first real step runs at t = 0
  CHECK(s.lr() == 0.0);
  s.step();
  CHECK(s.lr() == Approx(0.1));
  s.set_last_batch_iteration(-1);  // as a checkpoint restores it
  CHECK(s.lr() == 0.0);
  REQUIRE_THROWS_WITH(s.set_last_batch_iteration(-2), Catch::Contains("found -2"));
}

}  // namespace
}  // namespace tessera::optim
