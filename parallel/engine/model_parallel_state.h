// Checkpoint state of pipeline and tensor-parallel runs (Note [3D checkpoints] in
// parallel/engine/engine.h), and pretrained weights loaded into them: between one rank's parameters
// (a pipeline stage's, as tensor-parallel slices) and whole per-parameter tensors of the full
// model.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/module.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// `local` with every sharded parameter's tensors gathered whole over `model` (keys
// "<name>" for weights, "<kind>.<name>" for optimizer state, "step" as it is), placements
// from `params`. Collective over `model`.
StateDict gather_full(const StateDict& local, const std::vector<NamedParameter>& params,
                      Communicator& model);

// The part of a whole state that a rank holding `params` as slice `rank` of `size` loads:
// its parameters' keys only (with every optimizer kind the state has, and "step"), sharded
// ones sliced. Throws, naming the key, when one of its parameters is missing.
StateDict take_local(const StateDict& full, const std::vector<NamedParameter>& params, int rank,
                     int size, bool optimizer);

// Moves the entries of `state` whose parameter `is_param` accepts ("<name>"; with `optimizer`,
// "<kind>.<name>") into the result, both in their order; the others ("step" too) stay.
StateDict take_entries(StateDict& state, const std::function<bool(const std::string&)>& is_param,
                       bool optimizer);

// Throws, naming the key, unless every key of `state` names one of `params` ("<name>"; with
// `optimizer`, "step" and "<kind>.<name>"): a whole checkpoint for a rank that holds the
// whole model has nothing else.
void check_only_parameters(const StateDict& state, const std::vector<NamedParameter>& params,
                           bool optimizer);

}  // namespace tessera::parallel
