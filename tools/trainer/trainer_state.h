// The trainer's part of a checkpoint: state.json, as Trainer writes and reads it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "optim/loss_scaler.h"
#include "parallel/zero/flat_layout.h"
#include "tools/data/loader.h"

namespace tessera::train {

// A checkpoint's state.json, validated: every key Trainer writes, with its type and
// range; unknown keys are errors.
struct SavedTrainerState {
  int64_t step = 0;  // optimizer steps done
  int64_t scheduler_last_batch_iteration = 0;
  data::LoaderState loader;
  nlohmann::json model;                             // the model section (Trainer::model_json())
  std::optional<nlohmann::json> grid;               // [pipe, data, model] of the run that saved it
  std::optional<parallel::FlatLayout> zero_layout;  // $.zero.layout: sharded optimizer state
  std::optional<optim::LossScalerState> loss_scaler;  // fp16 runs
};

// Reads `state` (the parsed state.json of the checkpoint `source` names). Throws, naming
// the JSON path, for a missing, mistyped or out-of-range value.
SavedTrainerState read_trainer_state(const nlohmann::json& state, const std::string& source);

}  // namespace tessera::train
