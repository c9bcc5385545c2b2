#include "tools/trainer/trainer_state.h"

#include <limits>

#include "core/json.h"

namespace tessera::train {

SavedTrainerState read_trainer_state(const nlohmann::json& state, const std::string& source) {
  const std::string where = source + " state.json";
  TS_CHECK(state.is_object(), "[checkpoint] ", where, ": expected an object, found ",
           describe_json(state));
  JsonObjectReader s(state, "checkpoint");
  SavedTrainerState out;
  const nlohmann::json* model = s.raw("model");
  TS_CHECK(model != nullptr, "[checkpoint] ", where, ": $.model: required key missing");
  out.model = *model;
  s.raw("config");  // the config of the run that saved it, for readers of the checkpoint
  s.get_in_range<int64_t>("world", 1, 1, 1 << 20);
  if (const nlohmann::json* grid = s.raw("grid")) out.grid = *grid;
  out.step = s.required_in_range<int64_t>("step", 0, std::numeric_limits<int64_t>::max());
  out.scheduler_last_batch_iteration = s.required<int64_t>("scheduler_last_batch_iteration");
  const nlohmann::json* loader = s.raw("loader");
  TS_CHECK(loader != nullptr, "[checkpoint] ", where, ": $.loader: required key missing");
  out.loader = data::LoaderState::from_json(*loader, where + " $.loader");
  // Written before the dropout stream was keyed per step (Note [Dropout per step] in
  // parallel/engine/engine.h); the step has it now.
  s.raw("dropout_offset");
  if (s.has("curriculum_difficulty")) {
    out.curriculum_difficulty = s.required_in_range<int64_t>("curriculum_difficulty", 1,
                                                             std::numeric_limits<int64_t>::max());
  }
  if (const nlohmann::json* scaler = s.raw("loss_scaler")) {
    out.loss_scaler = optim::LossScalerState::from_json(*scaler, where + " $.loss_scaler");
  }
  if (s.has("zero")) {
    JsonObjectReader zero = s.required_object("zero");
    zero.get_in_range<int64_t>("stage", 0, 0, 3);
    if (const nlohmann::json* layout = zero.raw("layout")) {
      out.zero_layout = parallel::FlatLayout::from_json(*layout, where + " $.zero.layout");
    }
  }
  s.finish();
  return out;
}

}  // namespace tessera::train
