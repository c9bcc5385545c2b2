// zero_bench: what ZeRO stages 0-3 cost per rank, measured, next to the formulas.
//
//   bazel run -c opt //tools/bench:zero_bench -- [--model gpt2] [--worlds 1,2,4]
//
// For each stage and world size, `world` thread ranks each build the model, wrap it in an
// Engine at that ZeRO stage and take 2 AdamW steps on one sequence of --seq tokens. Then:
//   - model-state bytes per rank: the CPU allocator's live bytes after the step (when the
//     activations are gone), divided by the world size, next to the fp32 formula of
//     parallel/zero/memory_estimate.h (16P; 8P + 8P/N; 4P + 12P/N; 16P/N) and their ratio.
//     The target is within 5% of the formula plus the stated buffers (a reduce block in
//     flight; at stage 3 the persistent parameters, whole on every rank, DeepSpeed's
//     default threshold of 1e5 elements);
//   - bytes sent per step by rank 0 (CommStats, ring volumes), next to the theoretical
//     2(N-1)/N x 4P bytes for stages 0-2 (3(N-1)/N x 4P at stage 3: parameters gathered
//     for forward and for backward, gradients reduce-scattered) and their ratio;
//   - at stage 3, the most parameter bytes gathered at once (DeepSpeed's default bounds).
#include <cstdio>

#include "core/allocator.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/engine/engine.h"
#include "parallel/zero/memory_estimate.h"
#include "parallel/zero/zero_optimizer.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

constexpr const char* kUsage = R"(usage: zero_bench [--model NAME] [--worlds LIST] [--seq T]

Per-rank model-state bytes and bytes sent per step for ZeRO stages 0-3 on thread ranks.

  --model NAME   a GPT-2 preset (default gpt2: 124M parameters)
  --worlds LIST  comma-separated world sizes (default 1,2,4)
  --stages LIST  comma-separated ZeRO stages (default 0,1,2,3)
  --seq T        tokens of the one training sequence per rank and step (default 16)
  --help         print this and exit
)";

struct Measured {
  int64_t live_bytes = 0;  // allocator bytes live after the steps, all ranks
  int64_t sent_per_step = 0;
  parallel::ModelStateBytes state;  // rank 0's buffers
  int64_t peak_gathered = 0;        // stage 3: bytes of parameters gathered at once, at most
};

Measured measure(const GptConfig& cfg, int stage, int world, int64_t seq) {
  Measured m;
  Allocator& cpu = allocator_for(Device::cpu());
  const int64_t before = cpu.stats().allocated;
  std::vector<std::unique_ptr<Gpt>> models(static_cast<size_t>(world));
  std::vector<std::unique_ptr<parallel::Engine>> engines(static_cast<size_t>(world));
  parallel::run_thread_ranks(world, [&](parallel::Communicator& comm) {
    const size_t r = static_cast<size_t>(comm.rank());
    models[r] = std::make_unique<Gpt>(cfg, 1);
    parallel::EngineConfig ec;
    ec.optimizer.weight_decay = 0.1;
    ec.zero.stage = stage;
    ec.gradient_clipping = 1.0;
    ec.batch.gradient_accumulation_steps = 1;
    engines[r] = std::make_unique<parallel::Engine>(
        ec, *models[r],
        optim::decay_groups(models[r]->named_parameters(), ec.optimizer.lr,
                            ec.optimizer.weight_decay, true, {}),
        Device::cpu(), comm);
    const std::vector<int32_t> ids(static_cast<size_t>(seq), 7);
    const Tensor x = from_vector(ids, {1, seq});
    for (int step = 0; step < 2; ++step) {
      if (step == 1) comm.reset_stats();
      engines[r]->train_batch({{x, x}});
    }
    if (r == 0) {
      const parallel::ZeroOptimizer& zero = engines[r]->optimizer();
      m.sent_per_step = comm.stats().total_bytes_sent();
      m.state = zero.model_state_bytes();
      if (const parallel::PartitionedParams* pp = zero.partitioned()) {
        m.peak_gathered = pp->peak_live_numel() * static_cast<int64_t>(sizeof(float));
      }
    }
  });
  m.live_bytes = cpu.stats().allocated - before;
  return m;
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"model", Flag::kValue},
                          {"worlds", Flag::kValue},
                          {"stages", Flag::kValue},
                          {"seq", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const GptConfig cfg = GptConfig::preset(flags.get("model", "gpt2"));
  const std::vector<int64_t> worlds = flags.get_int_list("worlds", "1,2,4");
  const std::vector<int64_t> stages = flags.get_int_list("stages", "0,1,2,3");
  for (const int64_t w : worlds) {
    if (w < 1 || w > 64) throw cli::UsageError("--worlds expected sizes in 1..64");
  }
  for (const int64_t s : stages) {
    if (s < 0 || s > 3) throw cli::UsageError("--stages expected stages in 0..3");
  }
  const int64_t seq = flags.get_int("seq", 16);
  set_num_threads(1);  // ranks are threads already
  const int64_t p = cfg.num_parameters();
  std::printf("zero_bench: %s, %lld parameters; fp32 AdamW; per rank, MB = 1e6 bytes\n",
              flags.get("model", "gpt2").c_str(), static_cast<long long>(p));
  std::printf("%-5s %-5s | %10s %10s %6s | %8s %8s %8s | %10s %10s %6s | %8s\n", "stage", "world",
              "measured", "formula", "ratio", "params", "grads", "optim", "sent/step", "theory",
              "ratio", "gathered");
  for (const int stage : stages) {
    for (const int world : worlds) {
      const Measured m = measure(cfg, stage, world, seq);
      const double per_rank = static_cast<double>(m.live_bytes) / world;
      const double formula = static_cast<double>(parallel::fp32_model_state_bytes(stage, p, world));
      const double rounds = stage == 3 ? 3.0 : 2.0;
      const double theory = world == 1 ? 0.0 : rounds * (world - 1) / world * 4.0 * p;
      std::printf("%-5d %-5d | %10.1f %10.1f %6.3f | %8.1f %8.1f %8.1f | %10.1f %10.1f %6s | %8s\n",
                  stage, world, per_rank / 1e6, formula / 1e6, per_rank / formula,
                  m.state.params / 1e6, m.state.grads / 1e6, m.state.optimizer / 1e6,
                  m.sent_per_step / 1e6, theory / 1e6,
                  world == 1 ? "-" : std::to_string(m.sent_per_step / theory).substr(0, 5).c_str(),
                  stage == 3 ? std::to_string(m.peak_gathered / 1e6).substr(0, 6).c_str() : "-");
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool("zero_bench", tessera::kUsage, tessera::bench_main, argc, argv);
}
