// Runs a training config on thread ranks in one process, for the trainer tests.
#pragma once

#include <filesystem>

#include "parallel/comm/thread_comm.h"
#include "tools/trainer/trainer.h"

namespace tessera::testing {

// Trains `doc` to its end on `world` thread ranks; `dir` is the default run directory.
inline void train_on_threads(const nlohmann::json& doc, const std::filesystem::path& dir, int world,
                             train::ResumeMode mode) {
  parallel::run_thread_ranks(world, [&](parallel::Communicator& comm) {
    train::RunConfig cfg = train::parse_run_config(doc, "test", dir.string(), world);
    train::apply_run_environment(cfg, comm);
    train::Trainer trainer(std::move(cfg), mode, comm);
    trainer.run();
  });
}

}  // namespace tessera::testing
