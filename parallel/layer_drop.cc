#include "parallel/layer_drop.h"

#include <cmath>

#include "core/error.h"
#include "core/philox.h"

namespace tessera::parallel {

LayerDropConfig LayerDropConfig::from_json(JsonObjectReader s) {
  LayerDropConfig c;
  c.enabled = s.get<bool>("enabled", false);
  if (!c.enabled) {
    s.raw("theta");
    s.raw("gamma");
    return c;
  }
  c.theta = s.required<double>("theta");
  TS_CHECK(c.theta > 0 && c.theta <= 1, "[config] ", s.key_path("theta"),
           ": expected a keep probability in (0, 1], found ", c.theta);
  c.gamma = s.required<double>("gamma");
  TS_CHECK(std::isfinite(c.gamma) && c.gamma >= 0, "[config] ", s.key_path("gamma"),
           ": expected a decay rate >= 0, found ", c.gamma);
  return c;
}

double layer_drop_theta(const LayerDropConfig& c, int64_t t) {
  return (1.0 - c.theta) * std::exp(-c.gamma * static_cast<double>(t)) + c.theta;
}

double layer_drop_theta_for_step(const LayerDropConfig& c, int64_t step) {
  return layer_drop_theta(c, step > 0 ? step - 1 : 0);
}

LayerKeep layer_keep(int64_t layer, int64_t layers, double theta) {
  const double d = (1.0 - theta) / static_cast<double>(layers);
  return {1.0 - static_cast<double>(layer) * d, 1.0 - static_cast<double>(layer + 1) * d};
}

void LayerDropper::set(double theta, int64_t step) {
  theta_ = theta;
  step_ = step;
  forwards_ = 0;
}

std::optional<double> LayerDropper::keep(int64_t forward, int64_t layer, int64_t layers) const {
  const LayerKeep k = layer_keep(layer, layers, theta_);
  if (!layer_kept(seed_, step_, forward, layer, k.probability)) return std::nullopt;
  return k.divisor;
}

bool layer_kept(uint64_t seed, int64_t step, int64_t forward, int64_t layer, double probability) {
  if (probability >= 1.0) return true;
  // A key of its own: (seed, step) through one Philox round, apart from dropout's streams.
  const std::array<uint32_t, 4> k =
      philox4x32(static_cast<uint64_t>(step), 0x504c44 /* "PLD" */, seed);
  const uint64_t key = (static_cast<uint64_t>(k[0]) << 32) | k[1];
  const uint32_t r =
      philox4x32(static_cast<uint64_t>(layer), static_cast<uint64_t>(forward), key)[0];
  const double u = (static_cast<double>(r) + 0.5) / 4294967296.0;  // in (0, 1)
  return u < probability;
}

}  // namespace tessera::parallel
