// train: trains a GPT from a JSON config (tools/trainer/run_config.h).
//
//   bazel run //tools:train -- --config configs/shakespeare_char.json [--resume | --no-resume]
//
// Relative paths (the config, and the paths inside it) resolve against the directory the
// command was started from. Exit codes: 0 done, 2 bad flags, 1 any other error.
#include <cstdio>

#include "tools/cli/flags.h"
#include "tools/trainer/trainer.h"

namespace {

constexpr const char* kUsage = R"(usage: train --config FILE [--resume | --no-resume]

Trains the model the config describes; see configs/README.md for the keys.

  --config FILE   the run config (JSON)
  --resume        continue from the latest checkpoint; error when there is none
  --no-resume     start from step 0 even when checkpoints exist
                  (default: continue from the latest checkpoint when there is one)
  --help          print this and exit
)";

int train_main(int argc, char** argv) {
  using tessera::cli::Flag;
  const tessera::cli::Flags flags(
      argc, argv,
      {{"config", Flag::kValue}, {"resume", Flag::kSwitch}, {"no-resume", Flag::kSwitch}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (flags.has("resume") && flags.has("no-resume")) {
    throw tessera::cli::UsageError("--resume and --no-resume exclude each other");
  }
  const std::string config = flags.required("config");
  tessera::cli::enter_working_directory();
  const tessera::train::ResumeMode mode = flags.has("resume") ? tessera::train::ResumeMode::required
                                          : flags.has("no-resume")
                                              ? tessera::train::ResumeMode::never
                                              : tessera::train::ResumeMode::automatic;
  tessera::train::Trainer trainer(tessera::train::load_run_config(config), mode);
  trainer.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::run_tool("train", kUsage, train_main, argc, argv);
}
