// The dynamic loss scaler against the update rule of deepspeed/runtime/fp16/loss_scaler.py,
// with the expected scales worked out by hand from that rule.
#include "optim/loss_scaler.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

namespace tessera::optim {
namespace {

std::vector<double> trajectory(LossScaler& s, const std::vector<bool>& overflows) {
  std::vector<double> scales;
  for (bool o : overflows) {
    s.update(o);
    scales.push_back(s.scale());
  }
  return scales;
}

TEST_CASE("the reference vector: hysteresis 2, window 2, initial 2^16") {
  LossScaler s({.initial_scale_power = 16, .window = 2, .hysteresis = 2});
  CHECK(s.scale() == 65536.0);
  CHECK(trajectory(s, {true, true, false, false, false}) ==
        std::vector<double>{65536.0, 32768.0, 32768.0, 65536.0, 65536.0});
  CHECK(s.state().iteration == 5);
  CHECK(s.state().last_overflow_iteration == 1);
  CHECK(s.state().hysteresis_left == 2);
}

TEST_CASE("DeepSpeed's defaults double the scale every 1000 clean steps") {
  LossScaler s({});
  CHECK(s.scale() == 65536.0);
  // iteration - (-1) is a multiple of 1000 first at iteration 999.
  std::vector<bool> clean(999, false);
  trajectory(s, clean);
  CHECK(s.scale() == 65536.0);
  s.update(false);
  CHECK(s.scale() == 131072.0);
}

TEST_CASE("without hysteresis every overflow halves, down to the minimum, then it raises") {
  LossScaler s({.initial_scale_power = 3, .window = 100, .hysteresis = 1, .min_scale = 2.0});
  CHECK(trajectory(s, {true, true}) == std::vector<double>{4.0, 2.0});
  CHECK_THROWS_WITH(s.update(true), Catch::Contains("Current loss scale already at minimum"));
  LossScaler lenient({.initial_scale_power = 2,
                      .window = 100,
                      .hysteresis = 1,
                      .min_scale = 2.0,
                      .raise_at_min_scale = false});
  CHECK(trajectory(lenient, {true, true, true}) == std::vector<double>{2.0, 2.0, 2.0});
}

TEST_CASE("consecutive hysteresis refills on every clean step") {
  // Without it, one clean step between overflows does not restore the hysteresis.
  LossScaler plain({.initial_scale_power = 10, .window = 50, .hysteresis = 2});
  CHECK(trajectory(plain, {true, false, true}) == std::vector<double>{1024.0, 1024.0, 512.0});
  LossScaler consecutive(
      {.initial_scale_power = 10, .window = 50, .hysteresis = 2, .consecutive_hysteresis = true});
  CHECK(trajectory(consecutive, {true, false, true}) ==
        std::vector<double>{1024.0, 1024.0, 1024.0});
}

TEST_CASE("a static scale never moves") {
  LossScaler s({.static_scale = 128.0});
  CHECK_FALSE(s.dynamic());
  CHECK(trajectory(s, {true, false, false, true}) == std::vector<double>(4, 128.0));
}

TEST_CASE("the state round-trips through JSON and bad state is refused") {
  LossScaler s({.initial_scale_power = 8, .window = 3, .hysteresis = 3});
  trajectory(s, {true, false, true});
  LossScaler restored({.initial_scale_power = 8, .window = 3, .hysteresis = 3});
  restored.set_state(LossScalerState::from_json(s.state().to_json(), "state"));
  const std::vector<bool> rest = {false, false, false, true, true, false};
  CHECK(trajectory(restored, rest) == trajectory(s, rest));

  nlohmann::json bad = s.state().to_json();
  bad["scale"] = -1.0;
  CHECK_THROWS_WITH(LossScalerState::from_json(bad, "state"), Catch::Contains("scale"));
  nlohmann::json missing = s.state().to_json();
  missing.erase("iteration");
  CHECK_THROWS_WITH(LossScalerState::from_json(missing, "state"), Catch::Contains("iteration"));
}

}  // namespace
}  // namespace tessera::optim
