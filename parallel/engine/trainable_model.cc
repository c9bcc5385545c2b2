#include "parallel/engine/trainable_model.h"

#include "core/error.h"

namespace tessera::parallel {

Tensor TrainableModel::forward_stage(const Tensor&) const {
  TS_FAIL(
      "[engine] forward_stage: expected a model that can be split into pipeline stages, "
      "found one that cannot (its capabilities() have no pipeline)");
}

void TrainableModel::set_layer_drop(double, int64_t) {
  TS_FAIL(
      "[engine] progressive_layer_drop: expected a model that skips layers (GPT), found one "
      "that does not");
}

void TrainableModel::init_parameter(const std::string& name, const Tensor&) const {
  TS_FAIL("[engine] init_parameter(\"", name,
          "\"): expected a model that initializes its parameters one by one (GPT, BERT), found "
          "one that does not");
}

}  // namespace tessera::parallel
