// onebit_bench: what the 1-bit optimizers save on the wire, and what that buys on a slow
// link.
//
//   bazel run -c opt //tools/bench:onebit_bench -- [--model gpt2] [--worlds 4,8]
//       [--data .data/shakespeare_char] [--steps 100] [--gbps 1]
//
// Part 1, bytes and calls per optimizer step, for a GPT-2 preset (default 124M) at each
// world size: rank 0 of a world of W runs ZeroOptimizer (stage 0) with each optimizer on
// the whole model, over a communicator that counts what the real backends count
// (CommStats, Note [Bytes sent]) but moves no data; what a rank sends depends only on the
// sizes, and W thread ranks of a 124M model would not fit in memory. Each kind of step is
// taken once (gradients reduced by the optimizer's choice, clipped, stepped), next to
// AdamW's step and the ratio. Then 0/1 Adam's totals over a whole run of 100000 steps (its
// timeline with var_freeze_step 23000, var_update_scaler 16, local_step_clipper 16 and
// local_step_scaler 32678 (the default) or 1000), in bytes and in rounds (steps that
// communicate), next to the paper's 87% and 54% reductions.
//
// Part 2, end to end: the Tiny Shakespeare char GPT (configs/shakespeare_char.json's
// model, batch 16) trains --steps steps on 4 thread ranks whose every collective takes at
// least the time of a --gbps link (Note [Simulated link]), with AdamW and each 1-bit
// optimizer switched to its compressed stage after 20% of the steps. Tokens/s over the
// remaining 80% and the ratio to AdamW's.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/compression/onebit_config.h"
#include "parallel/compression/onebit_schedule.h"
#include "parallel/zero/zero_optimizer.h"
#include "tools/cli/flags.h"
#include "tools/trainer/run_config.h"
#include "tools/trainer/trainer.h"

namespace tessera {
namespace {

constexpr const char* kUsage =
    R"(usage: onebit_bench [--model NAME] [--worlds LIST] [--data DIR] [--steps N] [--gbps G]

Bytes and calls per step of 1-bit Adam, 0/1 Adam and 1-bit LAMB against AdamW, and
tokens/s at 4 thread ranks on a simulated slow link.

  --model NAME   GPT-2 preset of part 1 (default gpt2: 124M parameters)
  --worlds LIST  world sizes of part 1 (default 4,8)
  --data DIR     the shakespeare_char shards for part 2 (default .data/shakespeare_char;
                 part 2 is skipped when absent)
  --steps N      training steps per optimizer in part 2 (default 100)
  --gbps G       simulated link bandwidth in Gbit/s for part 2 (default 1)
  --help         print this and exit
)";

// Rank 0 of `size` ranks that counts every collective and moves nothing: outputs keep
// their contents. Enough to measure what the optimizers send, which depends on sizes only.
class CountingComm final : public parallel::Communicator {
 public:
  explicit CountingComm(int size) : Communicator(0, size, "counting", {}) {}

 protected:
  void do_all_reduce(const Tensor&, parallel::ReduceOp) override {}
  void do_reduce_scatter(const Tensor&, const Tensor&, parallel::ReduceOp) override {}
  void do_all_gather(const Tensor&, const Tensor&) override {}
  void do_all_to_all(const Tensor&, const Tensor&) override {}
  void do_broadcast(const Tensor&, int) override {}
  void do_send(const Tensor&, int) override {}
  void do_recv(const Tensor&, int) override {}
  void do_barrier() override {}
  std::unique_ptr<Communicator> do_split(int, int) override {
    TS_FAIL("[onebit_bench] the counting communicator does not split");
  }
  bool supports(Device) const override { return true; }
};

struct StepCost {
  int64_t bytes = 0;
  int64_t calls = 0;
};

optim::OptimizerConfig optimizer(const std::string& type) {
  optim::OptimizerConfig o;
  o.lr = 1e-4;
  o.weight_decay = 0.01;
  // Every kind of step within the first 8: 1-bit Adam and LAMB compress from step 3; 0/1
  // Adam has variance steps 2 and 4, 1-bit gradient steps 3 and 5, then syncs at 6 and 8
  // around a local step 7.
  parallel::OneBitOptions onebit;
  onebit.freeze_step = 2;
  onebit.var_freeze_step = 4;
  onebit.var_update_scaler = 1;
  onebit.local_step_scaler = 1;
  onebit.local_step_clipper = 2;
  if (type == "OneBitAdam")
    return parallel::make_onebit_config(parallel::OneBitKind::adam, onebit, o);
  if (type == "ZeroOneAdam") {
    return parallel::make_onebit_config(parallel::OneBitKind::zero_one_adam, onebit, o);
  }
  if (type == "OneBitLamb")
    return parallel::make_onebit_config(parallel::OneBitKind::lamb, onebit, o);
  return o;
}

// One step of each kind `type` takes in its first 8 steps (AdamW: "full_precision").
std::map<std::string, StepCost> step_costs(const GptConfig& cfg, int world,
                                           const std::string& type) {
  CountingComm comm(world);
  Gpt model(cfg, 1);
  const optim::OptimizerConfig o = optimizer(type);
  parallel::ZeroOptimizer zero(
      comm, model, optim::decay_groups(model.named_parameters(), o.lr, o.weight_decay, true, {}), o,
      parallel::ZeroConfig{});
  std::map<std::string, StepCost> out;
  for (int step = 1; step <= 8; ++step) {
    const std::string kind = zero.onebit()
                                 ? parallel::onebit_step_name(zero.onebit()->next_step_kind())
                                 : "full_precision";
    zero.zero_grad();
    {
      NoGradGuard no_grad;
      for (const Tensor& p : model.parameters()) p.grad().fill_(1e-3 * step);
    }
    const parallel::CommStats before = comm.stats();
    zero.reduce_gradients();
    zero.clip_grad_norm(1.0);
    zero.step();
    int64_t calls = 0;
    for (int op = 0; op < parallel::kNumCommOps; ++op) {
      const auto k = static_cast<parallel::CommOp>(op);
      calls += comm.stats()[k].calls - before[k].calls;
    }
    out[kind] = {comm.stats().total_bytes_sent() - before.total_bytes_sent(), calls};
    if (!zero.onebit()) break;
  }
  return out;
}

void part1(const GptConfig& cfg, const std::vector<int64_t>& worlds) {
  std::printf("== bytes and calls per optimizer step, rank 0, %lld parameters ==\n",
              static_cast<long long>(cfg.num_parameters()));
  for (const int64_t w : worlds) {
    const int world = static_cast<int>(w);
    const StepCost adam = step_costs(cfg, world, "AdamW").at("full_precision");
    std::printf("world %d: AdamW %.1f MB in %lld calls per step (reference)\n", world,
                adam.bytes / 1e6, static_cast<long long>(adam.calls));
    std::map<std::string, StepCost> zero_one;
    for (const std::string type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
      const std::map<std::string, StepCost> costs = step_costs(cfg, world, type);
      for (const auto& [kind, c] : costs) {
        if (kind == "init") continue;
        std::printf("  %-11s %-15s %8.2f MB %4lld calls  %6.2fx fewer bytes than AdamW\n",
                    type.c_str(), kind.c_str(), c.bytes / 1e6, static_cast<long long>(c.calls),
                    c.bytes > 0 ? static_cast<double>(adam.bytes) / c.bytes : 0.0);
      }
      if (type == "ZeroOneAdam") zero_one = costs;
    }
    // 0/1 Adam over a whole run: var_freeze_step 23000, var_update_scaler 16 and
    // local_step_clipper 16 (DeepSpeed's BERT tutorial), with DeepSpeed's default
    // local_step_scaler and with one that lets the sync interval reach its cap.
    constexpr int64_t kRun = 100000;
    for (const int64_t local_scaler : {32678, 1000}) {
      parallel::ZeroOneAdamSchedule s(23000, 16, local_scaler, 16);
      double bytes = 0;
      int64_t rounds = 0, calls = 0;
      for (int64_t t = 1; t <= kRun; ++t) {
        const std::string kind = parallel::onebit_step_name(s.next());
        if (kind == "init") continue;
        const StepCost& c = zero_one.at(kind);
        bytes += static_cast<double>(c.bytes);
        calls += c.calls;
        rounds += kind != "local";
      }
      const double adam_bytes = static_cast<double>(adam.bytes) * (kRun - 1);
      std::printf(
          "  0/1 Adam over %lld steps (local_step_scaler %lld): %.1f%% less data than AdamW "
          "(paper: up to 87%%), %.1f%% fewer rounds (paper: up to 54%%), %.2f collective "
          "calls per step (AdamW %lld)\n",
          static_cast<long long>(kRun), static_cast<long long>(local_scaler),
          100.0 * (1.0 - bytes / adam_bytes),
          100.0 * (1.0 - static_cast<double>(rounds) / (kRun - 1)),
          static_cast<double>(calls) / (kRun - 1), static_cast<long long>(adam.calls));
    }
  }
}

// Tokens/s of `type` on 4 thread ranks over the simulated link (steady state).
double tokens_per_second(const std::string& data, const std::string& type, int64_t steps,
                         double gbps, const std::filesystem::path& dir) {
  nlohmann::json params = {{"lr", type.find("Lamb") != std::string::npos ? 2e-2 : 1e-3},
                           {"weight_decay", 0.01}};
  if (type == "OneBitAdam" || type == "OneBitLamb") params["freeze_step"] = steps / 5;
  if (type == "ZeroOneAdam") params["var_freeze_step"] = steps / 5;
  const nlohmann::json doc = {
      {"train_batch_size", 16},
      {"train_micro_batch_size_per_gpu", 4},
      {"steps_per_print", steps},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", type}, {"params", params}}},
      {"simulated_network", {{"bandwidth_gbps", gbps}, {"latency_us", 50}}},
      {"model",
       {{"type", "gpt2"},
        {"vocab_size", 65},
        {"block_size", 64},
        {"n_layer", 4},
        {"n_head", 4},
        {"n_embd", 128}}},
      {"data", {{"train", data + "/train_*.bin"}, {"sampling", "random"}}},
      {"trainer", {{"steps", steps}, {"threads", 1}, {"log_dir", dir.string()}}}};
  parallel::run_thread_ranks(4, [&](parallel::Communicator& comm) {
    train::RunConfig cfg = train::parse_run_config(doc, "onebit_bench", dir.string(), 4);
    train::apply_run_environment(cfg, comm);  // the simulated link and one thread per rank
    train::Trainer trainer(std::move(cfg), train::ResumeMode::never, comm);
    trainer.run();
  });
  // The trainer's elapsed time after each step (metrics.jsonl): tokens over the time from
  // the end of step steps / 5 (the switch to compression) to the last.
  std::ifstream in(dir / "metrics.jsonl");
  std::map<int64_t, double> elapsed;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json rec = nlohmann::json::parse(line);
    if (rec["kind"] == "train") elapsed[rec["step"].get<int64_t>()] = rec["elapsed_s"];
  }
  const int64_t first = steps / 5;
  return static_cast<double>((steps - first) * 16 * 64) / (elapsed.at(steps) - elapsed.at(first));
}

void part2(const std::string& data, int64_t steps, double gbps) {
  if (!std::filesystem::exists(data + "/train_000000.bin")) {
    std::printf("== part 2 skipped: no shards in %s (run tools/setup.sh) ==\n", data.c_str());
    return;
  }
  std::printf("== tokens/s at 4 thread ranks, simulated %.1f Gbit/s link, 50 us latency ==\n",
              gbps);
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "onebit_bench";
  double adam = 0;
  for (const std::string type : {"AdamW", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    std::filesystem::remove_all(root / type);
    const double tok_s = tokens_per_second(data, type, steps, gbps, root / type);
    if (type == "AdamW") adam = tok_s;
    std::printf("  %-11s %9.0f tokens/s  %5.2fx AdamW%s\n", type.c_str(), tok_s, tok_s / adam,
                type == "AdamW" ? " (reference)" : "");
  }
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"model", Flag::kValue},
                          {"worlds", Flag::kValue},
                          {"data", Flag::kValue},
                          {"steps", Flag::kValue},
                          {"gbps", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  cli::enter_working_directory();
  part1(GptConfig::preset(flags.get("model", "gpt2")), flags.get_int_list("worlds", "4,8"));
  part2(flags.get("data", ".data/shakespeare_char"), flags.get_int("steps", 100),
        flags.get_double("gbps", 1.0));
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool("onebit_bench", tessera::kUsage, tessera::bench_main, argc, argv);
}
