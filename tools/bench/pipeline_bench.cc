// pipeline_bench: the pipeline's idle time per stage against the 1F1B bound, and the bytes
// a 3D step sends on each group against the analytic volumes.
//
//   bazel run -c opt //tools/bench:pipeline_bench -- [--stages 2,4] [--micro 4,8,16]
//                                                    [--model gpt2] [--seq 64]
//
// Bubble: P thread ranks run DeepSpeed's 1F1B schedule through the real executor and
// communicator over a synthetic stage whose forward takes F = 2 ms and backward 2F (sleeps,
// so that P ranks on few cores measure the schedule, not CPU contention). A stage's idle
// fraction is 1 - busy / batch time; the 1F1B bound is (P - 1) / (M + P - 1).
//
// Transfers: the same stages behind a simulated link of 2 ms per message, batch time with
// blocking stage transfers against non-blocking ones (M = 8).
//
// Volumes: one training step of the GPT-2 preset at (pipe, data, model) = (2, 2, 2) on 8
// thread ranks (ZeRO-1, 2 micro-batches of one --seq sequence per data rank), each rank's
// bytes sent per group (ring shares, CommStats) next to the analytic volume:
//   model: per micro-batch, each stage's two all-reduces of (B, T, C) per block forward
//     (attention and MLP outputs) and two backward (their inputs' gradients), plus the
//     embedding's reduce (first stage), the head input's gradient and the cross-entropy's
//     three (N) reductions (last stage); a ring all-reduce over T ranks sends
//     2 (T - 1) / T of the bytes;
//   pipe: per micro-batch, the (B, T, C) activation forward and its gradient backward;
//   data: ZeRO-1's reduce-scatter and all-gather of the stage slice's parameters,
//     2 (D - 1) / D x 4 bytes each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/engine/engine.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "parallel/topology.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

constexpr const char* kUsage =
    R"(usage: pipeline_bench [--stages LIST] [--micro LIST] [--model NAME] [--seq T]

Pipeline idle fraction per stage against the 1F1B bound, and the bytes of one 3D
(2, 2, 2) training step per group against the analytic volumes.

  --stages LIST  pipeline stages for the bubble runs (default 2,4)
  --micro LIST   micro-batches per batch (default 4,8,16)
  --model NAME   GPT-2 preset of the volume run (default gpt2: 124M; "none" skips it)
  --seq T        tokens per sequence in the volume run (default 64)
  --help         print this and exit
)";

constexpr std::chrono::microseconds kForward{2000};

// A rank that fails ends the others' waits within a minute.
parallel::CommOptions quick() {
  parallel::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

// A stage with fixed compute times: forward F, backward 2F, on a small real tensor so the
// executor's sends, receives and gradients are the real ones.
class TimedStage : public parallel::pipeline::PipelineStage {
 public:
  TimedStage() : weight_(ones({1, 256})) { weight_.set_requires_grad(true); }
  Tensor forward(const Tensor& input) override {
    std::this_thread::sleep_for(kForward);
    return mul(input, weight_);
  }
  Tensor loss(const Tensor& output, const Tensor&) override { return sum(output); }
  void backward(const Tensor& root, const Tensor& grad, bool) override {
    std::this_thread::sleep_for(2 * kForward);
    tessera::backward(root, grad);
  }
  Device device() const override { return Device::cpu(); }

 private:
  Tensor weight_;  // (1, 256): the stage's one parameter
};

// The stages' timings of one batch of `micro` micro-batches over `stages` synthetic stages
// behind `link`, with blocking or non-blocking transfers.
std::vector<parallel::pipeline::PipelineTiming> timed_batch(int stages, int micro,
                                                            const parallel::SimulatedLink& link,
                                                            bool nonblocking) {
  std::vector<parallel::pipeline::PipelineTiming> timing(stages);
  std::mutex mutex;
  parallel::run_thread_ranks(
      stages,
      [&](parallel::Communicator& pipe) {
        pipe.set_simulated_link(link);
        TimedStage stage;
        parallel::pipeline::PipelineExecutor executor(pipe, stage, {}, nonblocking);
        std::vector<parallel::pipeline::MicroBatch> batches;
        for (int m = 0; m < micro; ++m) batches.push_back({ones({1, 256}), ones({1, 256})});
        executor.train_batch(batches);  // warm-up
        pipe.barrier();
        executor.train_batch(batches);
        std::lock_guard<std::mutex> lock(mutex);
        timing[pipe.rank()] = executor.last_timing();
      },
      quick());
  return timing;
}

void bubble(int stages, int micro) {
  const std::vector<parallel::pipeline::PipelineTiming> timing =
      timed_batch(stages, micro, {}, true);
  const double bound = static_cast<double>(stages - 1) / (micro + stages - 1);
  std::printf("P=%d M=%-3d idle per stage:", stages, micro);
  double mean = 0;
  for (const auto& t : timing) {
    const double idle = 1.0 - t.busy_s / t.total_s;
    mean += idle / stages;
    std::printf(" %.3f", idle);
  }
  std::printf(" | mean %.3f, 1F1B bound %.3f, ratio %.2f\n", mean, bound, mean / bound);
}

// Batch time with blocking and with non-blocking stage transfers (Note [Non-blocking stage
// transfers] in parallel/pipeline/executor.h) behind a link whose per-message latency is
// the forward time F: a blocking send holds its stage for F, a non-blocking one does not.
void transfers(int stages, int micro) {
  const parallel::SimulatedLink link{.gbit_per_s = 100, .latency_us = 2000};
  double blocking = 0, nonblocking = 0;
  for (const auto& t : timed_batch(stages, micro, link, false)) {
    blocking = std::max(blocking, t.total_s);
  }
  for (const auto& t : timed_batch(stages, micro, link, true)) {
    nonblocking = std::max(nonblocking, t.total_s);
  }
  std::printf("P=%d M=%-3d batch ms: blocking %.1f, non-blocking %.1f, ratio %.2f\n", stages, micro,
              blocking * 1e3, nonblocking * 1e3, blocking / nonblocking);
}

struct Volume {
  double model = 0, pipe = 0, data = 0;  // bytes sent per step
};

void volumes(const GptConfig& cfg, int64_t seq) {
  const parallel::ProcessGrid grid(2, 2, 2);
  const int micro = 2;
  std::vector<Volume> measured(grid.world_size()), analytic(grid.world_size());
  std::mutex mutex;
  set_num_threads(1);
  parallel::run_thread_ranks(
      grid.world_size(),
      [&](parallel::Communicator& world) {
        parallel::ParallelGroups g = parallel::make_parallel_groups(world, grid);
        const std::vector<int> parts = parallel::pipeline::partition_layers(
            pipeline_layers(cfg), grid.pipe_size(), "parameters");
        const GptPart part = part_of_stage(cfg, parts, g.coord.pipe);
        Gpt model(cfg, 1, g.model.get(), part);
        parallel::EngineConfig ec;
        ec.zero.stage = 1;
        ec.gradient_clipping = 1.0;
        ec.batch.gradient_accumulation_steps = micro;
        ec.pipeline.stages = grid.pipe_size();
        ec.tensor_parallel.tp_size = grid.model_size();
        parallel::Engine engine(
            ec, model,
            optim::decay_groups(model.named_parameters(), ec.optimizer.lr, 0.0, true, {}),
            Device::cpu(), *g.data, &g);
        std::vector<parallel::pipeline::MicroBatch> batches;
        for (int m = 0; m < micro; ++m) {
          batches.push_back({zeros({1, seq}, {DType::i64}), zeros({1, seq}, {DType::i64})});
        }
        g.data->reset_stats(), g.pipe->reset_stats(), g.model->reset_stats();
        engine.train_batch(batches);
        // Analytic: activations (1, T, C) in f32.
        const double act = static_cast<double>(seq * cfg.n_embd * 4);
        const double tp = grid.model_size(), dp = grid.data_size();
        const int64_t blocks =
            (part.end_block < 0 ? cfg.n_layer : part.end_block) - part.first_block;
        double reductions = 4.0 * blocks * act;  // per micro-batch
        if (part.embedding) reductions += act;
        if (part.head) reductions += act + 3.0 * seq * 4;
        Volume a;
        a.model = micro * reductions * 2 * (tp - 1) / tp;
        a.pipe = micro * act;  // one direction each: activations down, gradients up
        int64_t local = 0;
        for (const NamedParameter& p : model.named_parameters()) local += p.tensor.numel();
        a.data = 2 * (dp - 1) / dp * 4.0 * static_cast<double>(local);
        Volume m{static_cast<double>(g.model->stats().total_bytes_sent()),
                 static_cast<double>(g.pipe->stats().total_bytes_sent()),
                 static_cast<double>(g.data->stats().total_bytes_sent())};
        std::lock_guard<std::mutex> lock(mutex);
        measured[world.rank()] = m;
        analytic[world.rank()] = a;
      },
      quick());
  std::printf(
      "\n%s at (pipe, data, model) = (2, 2, 2), ZeRO-1, %d micro-batches of 1 x %lld "
      "tokens per data rank: MB sent per rank in one step, measured / analytic\n",
      "GPT-2", micro, static_cast<long long>(seq));
  std::printf("%-6s %-22s %-22s %-22s\n", "rank", "model group", "pipe group", "data group");
  for (int r = 0; r < grid.world_size(); ++r) {
    const Volume& m = measured[r];
    const Volume& a = analytic[r];
    std::printf("%-6d %8.3f / %8.3f    %8.3f / %8.3f    %8.2f / %8.2f\n", r, m.model / 1e6,
                a.model / 1e6, m.pipe / 1e6, a.pipe / 1e6, m.data / 1e6, a.data / 1e6);
  }
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"stages", Flag::kValue},
                          {"micro", Flag::kValue},
                          {"model", Flag::kValue},
                          {"seq", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::vector<int64_t> stages = flags.get_int_list("stages", "2,4");
  const std::vector<int64_t> micro = flags.get_int_list("micro", "4,8,16");
  std::printf("1F1B bubble: synthetic stages (forward 2 ms, backward 4 ms)\n");
  for (int64_t p : stages) {
    for (int64_t m : micro) bubble(static_cast<int>(p), static_cast<int>(m));
  }
  std::printf("stage transfers behind a link of 2 ms per message (= F), blocking vs not\n");
  for (int64_t p : stages) transfers(static_cast<int>(p), 8);
  const std::string preset = flags.get("model", "gpt2");
  if (preset != "none") volumes(GptConfig::preset(preset), flags.get_int("seq", 64));
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool("pipeline_bench", tessera::kUsage, tessera::bench_main, argc, argv);
}
