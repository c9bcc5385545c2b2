// train: trains a GPT from a JSON config (tools/trainer/run_config.h).
//
//   bazel run //tools:train -- --config configs/shakespeare_char.json [--resume | --no-resume]
//   mpirun -np 4 bazel-bin/tools/train --config configs/shakespeare_char.json
//   bazel run //tools:train -- --check-config --config ds_config.json --world 8
//   bazel run //tools:train -- --config configs/shakespeare_char_cuda_3d.json --thread-ranks 4
//
// Under mpirun every process is one rank (rank and world from the MPI environment): a
// data-parallel rank (Note [Data-parallel engine] in parallel/engine/engine.h), or a place
// in the (pipe, data, model) grid when the config has a pipeline or tensor slicing (Note
// [3D engine]). With "device": "cuda", rank r of a node drives cuda:r and gradients move
// over NCCL. With --thread-ranks N the ranks are threads of one process instead, and a
// CUDA run's ranks share its one GPU. Relative paths
// (the config, and the paths inside it) resolve against the directory the command was
// started from. Exit codes: 0 done, 2 bad flags, 1 any other error.
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/factories.h"
#include "core/logging.h"
#include "parallel/comm/host_staged_comm.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/comm/nccl_comm.h"
#include "parallel/comm/thread_comm.h"
#include "tools/cli/flags.h"
#include "tools/trainer/config_summary.h"
#include "tools/trainer/trainer.h"

namespace {

using tessera::parallel::Communicator;

constexpr const char* kUsage =
    R"(usage: train --config FILE [--resume | --no-resume] [--comm-timeout S] [--thread-ranks N]
       mpirun -np N train --config FILE [...]
       train --check-config --config FILE [--world N]

Trains the model the config describes; see configs/README.md for the keys. Under mpirun,
each process is a rank: with $.pipeline.stages P and $.tensor_parallel.tp_size T, N must
be a multiple of P x T, and the batch keys must fit the N / (P x T) data-parallel ranks. With
"trainer": {"device": "cuda"}, the ranks of a node drive one GPU each and reduce over NCCL.

  --config FILE     the run config (JSON)
  --resume          continue from the latest checkpoint; error when there is none
  --no-resume       start from step 0 even when checkpoints exist
                    (default: continue from the latest checkpoint when there is one)
  --comm-timeout S  seconds a rank waits for the others in one collective before the run
                    fails with an error naming the operation and the ranks that had not
                    arrived (default 300; 0.001 to 604800). Choose a few times the longest
                    step (plus checkpoint saves): a stopped rank holds the job this long
                    (docs/reliability.md)
  --thread-ranks N  run N ranks as threads of this process instead of mpirun processes
                    (1..1024); with "device": "cuda" they share the one GPU, moving its
                    tensors through host memory: how a layout of several ranks (a
                    pipeline, tensor slices, ZeRO-3) runs and is tested on one GPU
  --check-config    validate the whole config for N ranks (--world, default 1), print what it
                    resolves to (layout, batch triple, precision, ZeRO stage, optimizer,
                    model-state memory per rank, data shards) and exit without training
  --world N         with --check-config: the number of ranks (processes) to check for
  --help            print this and exit
)";

// --check-config: the config validated for `world` ranks and its resolved values printed.
int check_config(const std::string& config, int64_t world) {
  const tessera::train::RunConfig cfg = tessera::train::load_run_config(config, world);
  std::printf("%s: valid for %lld rank(s)\n", config.c_str(), static_cast<long long>(world));
  for (const std::string& w : cfg.warnings) std::printf("  warning: %s\n", w.c_str());
  for (const std::string& line : cfg.auto_filled) std::printf("  filled: %s\n", line.c_str());
  for (const std::string& line : tessera::train::describe_run_config(cfg, world))
    std::printf("  %s\n", line.c_str());
  return 0;
}

tessera::train::ResumeMode resume_mode(const tessera::cli::Flags& flags) {
  if (flags.has("resume") && flags.has("no-resume")) {
    throw tessera::cli::UsageError("--resume and --no-resume exclude each other");
  }
  return flags.has("resume")      ? tessera::train::ResumeMode::required
         : flags.has("no-resume") ? tessera::train::ResumeMode::never
                                  : tessera::train::ResumeMode::automatic;
}

// One rank of an mpirun job. Reading the config is checked by all ranks together, so that
// a config that does not fit the world fails on every rank with its own message and the
// job ends cleanly. A later error ends the whole job (MPI_Abort): peers may be waiting in
// a collective that will never complete.
int train_mpi(int* argc, char*** argv, const std::string& config, tessera::train::ResumeMode mode,
              tessera::parallel::CommOptions options) {
  tessera::parallel::MpiRuntime mpi(argc, argv);
  tessera::set_log_rank(mpi.world_rank());
  std::unique_ptr<Communicator> world = tessera::parallel::mpi_world(mpi, options);
  std::optional<tessera::train::RunConfig> cfg;
  std::string error;
  try {
    cfg = tessera::train::load_run_config(config, world->size());
  } catch (const std::exception& e) {
    error = e.what();
  }
  const tessera::Tensor ok = tessera::scalar_tensor(error.empty() ? 1 : 0, {tessera::DType::i32});
  world->all_reduce(ok, tessera::parallel::ReduceOp::min);
  if (!error.empty() || ok.item<int>() == 0) {
    std::fprintf(stderr, "train: error: [rank %d] %s\n", mpi.world_rank(),
                 error.empty() ? "another rank could not read the config (its error is printed "
                                 "above); expected every rank to start"
                               : error.c_str());
    world.reset();
    return 1;
  }
  try {
    // A CUDA run drives one GPU per rank, cuda:(N + local rank) for the config's cuda:N,
    // and reduces gradients over NCCL; the MPI world keeps the trainer's CPU values.
    std::unique_ptr<Communicator> gpus;
    tessera::Device& device = cfg->trainer.device;
    if (device.is_cuda() && world->size() > 1) {
      device = tessera::Device::cuda(device.index + mpi.local_rank());
      gpus = tessera::parallel::nccl_group(*world, device.index, options);
    }
    tessera::train::apply_run_environment(*cfg, *world, gpus.get());
    tessera::train::Trainer trainer(std::move(*cfg), mode, *world, gpus.get());
    trainer.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: error: [rank %d] %s\n", mpi.world_rank(), e.what());
    std::fflush(stderr);
    mpi.abort(1);
  }
  world.reset();  // before MPI is finalized
  return 0;
}

// --thread-ranks: `ranks` ranks as threads of this process. The config is read once, before
// any thread starts, and every rank trains a copy of it. A CUDA run's ranks all drive the
// configured device and move its tensors over host staging
// (parallel/comm/host_staged_comm.h), as NCCL refuses two ranks on one GPU. A rank's error
// is printed at once, naming the rank, and ends the run (exit code 1); its peers stop at
// their next collective, within --comm-timeout, printing theirs.
int train_thread_ranks(const std::string& config, tessera::train::ResumeMode mode,
                       tessera::parallel::CommOptions options, int ranks) {
  const tessera::train::RunConfig checked = tessera::train::load_run_config(config, ranks);
  const std::vector<std::unique_ptr<Communicator>> staging =
      tessera::parallel::make_thread_group(ranks, options);
  try {
    tessera::parallel::run_thread_ranks(
        ranks,
        [&](Communicator& world) {
          try {
            tessera::train::RunConfig cfg = checked;
            std::unique_ptr<Communicator> device;
            if (cfg.trainer.device.is_cuda() && ranks > 1) {
              device = tessera::parallel::host_staged(*staging[world.rank()]);
            }
            tessera::train::apply_run_environment(cfg, world, device.get());
            tessera::train::Trainer trainer(std::move(cfg), mode, world, device.get());
            trainer.run();
          } catch (const std::exception& e) {
            // Now, not after the peers' timeouts: theirs would name this rank, not the cause.
            std::fprintf(stderr, "train: error: [rank %d] %s\n", world.rank(), e.what());
            std::fflush(stderr);
            throw;
          }
        },
        options);
  } catch (const std::exception&) {
    return 1;  // every failed rank has printed its error
  }
  return 0;
}

int train_main(int argc, char** argv) {
  using tessera::cli::Flag;
  const tessera::cli::Flags flags(argc, argv,
                                  {{"config", Flag::kValue},
                                   {"resume", Flag::kSwitch},
                                   {"no-resume", Flag::kSwitch},
                                   {"comm-timeout", Flag::kValue},
                                   {"check-config", Flag::kSwitch},
                                   {"world", Flag::kValue},
                                   {"thread-ranks", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const tessera::train::ResumeMode mode = resume_mode(flags);
  const std::string config = flags.required("config");
  if (flags.has("world") && !flags.has("check-config")) {
    throw tessera::cli::UsageError(
        "--world is for --check-config; a run's world is the number of mpirun processes, or "
        "--thread-ranks");
  }
  if (flags.has("check-config")) {
    for (const char* run_flag : {"resume", "no-resume", "comm-timeout", "thread-ranks"}) {
      if (flags.has(run_flag)) {
        throw tessera::cli::UsageError(std::string("--") + run_flag +
                                       " is for a run; --check-config trains nothing");
      }
    }
    const int64_t world = flags.get_int("world", 1);
    if (world < 1 || world > (1 << 20)) {
      throw tessera::cli::UsageError("--world expected ranks in 1..1048576, found " +
                                     flags.required("world"));
    }
    tessera::cli::enter_working_directory();
    return check_config(config, world);
  }
  // 1 ms to a week: whole milliseconds that int64 holds, and a stopped peer noticed.
  const double timeout_s = flags.get_double("comm-timeout", 300.0);
  if (!(timeout_s >= 0.001 && timeout_s <= 604800.0)) {
    throw tessera::cli::UsageError(
        "--comm-timeout expected seconds in [0.001, 604800] (1 ms to a week), found " +
        flags.required("comm-timeout"));
  }
  tessera::parallel::CommOptions options;
  options.timeout = std::chrono::milliseconds(std::llround(timeout_s * 1000.0));
  tessera::cli::enter_working_directory();
  const bool mpi = tessera::parallel::MpiRuntime::launched_by_mpirun();
  if (flags.has("thread-ranks")) {
    if (mpi) {
      throw tessera::cli::UsageError(
          "--thread-ranks runs the ranks in one process; under mpirun each process is a rank");
    }
    const int64_t ranks = flags.get_int("thread-ranks", 1);
    if (ranks < 1 || ranks > 1024) {
      throw tessera::cli::UsageError("--thread-ranks expected ranks in 1..1024, found " +
                                     flags.required("thread-ranks"));
    }
    return train_thread_ranks(config, mode, options, static_cast<int>(ranks));
  }
  if (mpi) return train_mpi(&argc, &argv, config, mode, options);
  std::unique_ptr<Communicator> single =
      std::move(tessera::parallel::make_thread_group(1, options)[0]);
  tessera::train::RunConfig cfg = tessera::train::load_run_config(config);
  tessera::train::apply_run_environment(cfg, *single);
  tessera::train::Trainer trainer(std::move(cfg), mode, *single);
  trainer.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::run_tool("train", kUsage, train_main, argc, argv);
}
