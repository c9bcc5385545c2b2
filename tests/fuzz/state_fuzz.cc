// Fuzzes the reader of a checkpoint's state.json (tools/trainer/trainer_state.h): the step,
// schedule, data cursor, loss scaler and ZeRO layout a resume reads. Seeds:
// tests/fuzz/corpus/state/.
#include "core/json.h"
#include "tests/fuzz/fuzz_target.h"
#include "tools/trainer/trainer_state.h"

namespace tessera::fuzz {

FuzzTarget make_fuzz_target(const std::filesystem::path&) {
  return {{"\"step\"",
           "\"scheduler_last_batch_iteration\"",
           "\"model\"",
           "\"config\"",
           "\"world\"",
           "\"grid\"",
           "\"loader\"",
           "\"shard\"",
           "\"position\"",
           "\"epoch\"",
           "\"loss_scaler\"",
           "\"scale\"",
           "\"iteration\"",
           "\"last_overflow_iteration\"",
           "\"hysteresis_left\"",
           "\"zero\"",
           "\"stage\"",
           "\"layout\"",
           "\"block_numel\"",
           "\"params\"",
           "\"name\"",
           "\"shape\"",
           "\"group\""},
          [](const std::string& input) {
            train::read_trainer_state(parse_json(input, "state.json"), "fuzz");
          }};
}

}  // namespace tessera::fuzz
