#include "parallel/engine/trainable_model.h"

#include "core/error.h"

namespace tessera::parallel {

Tensor TrainableModel::forward_stage(const Tensor&) const {
  TS_FAIL(
      "[engine] forward_stage: expected a model that can be split into pipeline stages, "
      "found one that cannot (its capabilities() have no pipeline)");
}

}  // namespace tessera::parallel
