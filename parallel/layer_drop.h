// DeepSpeed's progressive layer drop (deepspeed/runtime/progressive_layer_drop.py; Zhang
// and He, "Accelerating Training of Transformer-Based Language Models with Progressive
// Layer Dropping", arXiv:2010.13369): training skips transformer layers at random, more of
// them as training goes on and deeper layers more often.
//
// Note [Progressive layer drop]
// The keep parameter follows theta(t) = (1 - theta_bar) exp(-gamma t) + theta_bar, computed
// in double precision, from 1 at t = 0 down to theta_bar ("theta"). DeepSpeed updates it in
// step() with global_steps before the increment, so the forwards of step k (0-based) see
// theta(max(k - 1, 0)). Per training forward, with L layers and d = (1 - theta) / L, layer
// i (0-based, counted over the whole model) is kept with probability 1 - i d and, when kept,
// its two sub-blocks' outputs are divided by 1 - (i + 1) d before they join the residual
// stream (DeepSpeed's BERT example: one draw per layer per forward, shared by the whole
// batch; the scale is one layer ahead of the keep probability, a quirk copied here); a
// dropped layer is the identity. Layer 0 is always kept. The draw for layer i in the f-th
// training forward since step `step` began is a Philox number keyed by (seed, step), so it
// is the same on every rank (ZeRO-3's gathers and tensor slicing's collectives stay in
// step), for any pipeline layout, and after a resume. Evaluation keeps every layer. GPT is
// pre-LN as the example is; Tessera's BERT is post-LN and divides each branch before its
// residual sum and LayerNorm.
#pragma once

#include <cstdint>
#include <optional>

#include "core/json.h"

namespace tessera::parallel {

// The "progressive_layer_drop" section: theta and gamma are required when enabled
// (DeepSpeed indexes them directly).
struct LayerDropConfig {
  bool enabled = false;
  double theta = 1.0;  // theta_bar, in (0, 1]
  double gamma = 0.0;  // >= 0

  static LayerDropConfig from_json(JsonObjectReader section);
};

// theta(t) of Note [Progressive layer drop].
double layer_drop_theta(const LayerDropConfig& config, int64_t t);
// The theta the forwards of step `step` (0-based: global_steps before it) use.
double layer_drop_theta_for_step(const LayerDropConfig& config, int64_t step);

// Layer `layer` of `layers` at `theta`: its keep probability and its sub-blocks' divisor.
struct LayerKeep {
  double probability = 1.0;
  double divisor = 1.0;
};
LayerKeep layer_keep(int64_t layer, int64_t layers, double theta);

// Whether layer `layer` is kept in training forward `forward` (0, 1, ... since step `step`
// began), by a Philox draw keyed by (seed, step) against `probability`.
bool layer_kept(uint64_t seed, int64_t step, int64_t forward, int64_t layer, double probability);

// A model's layer drop between the engine's calls: the step's theta and key, and the
// training forwards drawn so far (what GPT and BERT hold for set_layer_drop()).
class LayerDropper {
 public:
  // Model seed `seed` keys the draws; theta 1 until set().
  explicit LayerDropper(uint64_t seed) : seed_(seed) {}
  // The step's theta; the forwards after it draw afresh from step `step`'s key.
  void set(double theta, int64_t step);
  // Whether a training forward may drop layers (theta below 1).
  bool active() const { return theta_ < 1.0; }
  // Starts a training forward; returns its number since set().
  int64_t next_forward() { return forwards_++; }
  // Layer `layer` of `layers` in forward `forward`: its divisor when kept, nullopt when
  // dropped.
  std::optional<double> keep(int64_t forward, int64_t layer, int64_t layers) const;

 private:
  uint64_t seed_;
  double theta_ = 1.0;
  int64_t step_ = 0;
  int64_t forwards_ = 0;
};

}  // namespace tessera::parallel
