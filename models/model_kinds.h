// The model kinds a run config can name (Note [Model kinds] in models/model_spec.h).
#pragma once

#include <memory>
#include <optional>

#include "core/json.h"
#include "models/model_spec.h"
#include "models/sparse/sparsity_config.h"

namespace tessera {

// Reads a run config's model section (checkpoint_activations and init_from already read):
// its "type" picks the kind, whose parser reads the rest and calls finish() on the section.
// `sparse_attention` is the run's top-level section, which the kind takes into its
// attention or refuses.
std::shared_ptr<const ModelSpec> parse_model_spec(
    JsonObjectReader& model, const std::optional<SparsityConfig>& sparse_attention);

}  // namespace tessera
