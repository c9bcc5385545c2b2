// The trainer's part of a checkpoint: state.json, as Trainer writes and reads it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "parallel/engine/engine.h"
#include "tools/data/loader.h"

namespace tessera::train {

// A checkpoint's state.json, validated: every key Trainer writes (the engine's counters,
// parallel::Engine::state_json(), and the trainer's own), with its type and range; unknown
// keys are errors.
struct SavedTrainerState : parallel::EngineCounters {
  data::LoaderState loader;
  nlohmann::json model;  // the model section (ModelSpec::to_json())
  // The curriculum's sequence length (Note [Curriculum schedule] in parallel/curriculum.h),
  // in runs that have one.
  std::optional<int64_t> curriculum_difficulty;
};

// Reads `state` (the parsed state.json of the checkpoint `source` names). Throws, naming
// the JSON path, for a missing, mistyped or out-of-range value.
SavedTrainerState read_trainer_state(const nlohmann::json& state, const std::string& source);

}  // namespace tessera::train
