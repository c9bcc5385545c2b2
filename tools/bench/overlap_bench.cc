// overlap_bench: the training step with overlap_comm against without, for ZeRO data
// parallelism on thread ranks behind the simulated link (Note [Simulated link] in
// parallel/comm/communicator.h; Note [Overlapped reductions] in
// parallel/zero/gradient_reducer.h).
//
//   bazel run //tools/bench:overlap_bench -- [--world 4] [--stages 0,1,2] [--steps 6]
//
// Per stage: first a calibration without a link times rank 0's step (forward, backward,
// clipping and the optimizer step) and counts every byte it sends per step (CommStats):
// the gradient reductions, and at stages 1-2 the parameters' all-gather after the step, at
// stage 3 the gathers around every module call in forward and backward. The link is then
// set so that those bytes take as long as the step computes (communication equal to
// computation), and the step runs with overlap_comm off and on, in alternating rounds of an
// untimed step and two timed ones per mode, so that each timed step also waits for what the
// step before it left travelling; the medians and their ratio are printed. With overlap the
// reductions travel during backward (Note [Overlapped reductions]), stages 1-2's gathers
// during the next forward (Note [Gathers after the step] in parallel/zero/parameter_store.h)
// and stage 3's ahead of their modules (prefetch). The modes' optimizers share the group,
// so a round ends by waiting for its optimizer's travelling gathers, untimed.
//
// The last rows are (pipe, data, model) layouts through the Engine: (2, 1, 2), the same
// model as a 2-stage pipeline of 2 tensor slices on 4 ranks, and (1, 1, 2), 2 tensor slices
// on 2 ranks; 4 micro-batches per step, ZeRO-1, with pipeline.overlap_transfers and
// tensor_parallel.overlap_comm off and on, and with overlap tensor_parallel.batch_split 2.
// The calibration counts rank 0's bytes on the pipe and model groups per step, and the link
// is set so that they take as long as the step's computation; with overlap the
// stage-to-stage transfers travel under the stages' computation, the forward's row-parallel
// sums of one half of a micro-batch under the other half's computation (Note [Batch-split
// overlap] in models/gpt2/batch_split.h), and the column-parallel input gradients' sums
// under their weight gradients' products and the other half's backward (Notes [Overlapped
// input gradients] in parallel/tensor/layers.h and [Deferred gradient waits] in
// autograd/gradient_wait.h). The model is a 6-layer GPT (n_embd 256, vocabulary 2048, T 64,
// 4 sequences per rank); each rank is one thread.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/factories.h"
#include "core/json.h"
#include "core/parallel.h"
#include "models/gpt2/gpt.h"
#include "models/gpt2/spec.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/engine/engine.h"
#include "parallel/engine_config.h"
#include "parallel/topology.h"
#include "parallel/zero/zero_optimizer.h"
#include "tools/bench/stats.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

constexpr const char* kUsage = R"(usage: overlap_bench [--world N] [--stages LIST] [--steps N]

ZeRO step time with overlap_comm off and on, behind a simulated link on which the step's
communication takes as long as its computation; thread ranks.

  --world N      ranks (default 4)
  --stages LIST  comma-separated ZeRO stages among 0-3 (default 0,1,2,3)
  --steps N      timed steps per mode (default 6, rounded up to even)
  --help         print this and exit
)";

using Clock = std::chrono::steady_clock;

GptConfig model_config() {
  GptConfig c;
  c.vocab_size = 2048;
  c.block_size = 64;
  c.n_layer = 6;
  c.n_head = 4;
  c.n_embd = 256;
  return c;
}

// Rank 0's timed steps. The phases: forward (with the loss), backward (with the blocking
// reductions), and the rest (clipping and the optimizer step, with stages 1-2's blocking
// gathers).
struct Timing {
  std::vector<double> step, forward, backward, rest;              // seconds per timed step
  int64_t forward_bytes = 0, backward_bytes = 0, rest_bytes = 0;  // sent per step, every op
  int64_t bytes() const { return forward_bytes + backward_bytes + rest_bytes; }
};

// Note [Ideal overlap]
// The step time if every byte travelled while computation went on wherever it may: the
// forward hides what it gathers itself (stage 3) and what the step before left travelling
// (stages 1-2's gathers after the step); backward hides its own gathers and reductions;
// clipping and the step hide nothing. From the calibration's phase times without a link
// and its bytes per phase on the link:
//   max(F, link(forward + rest bytes)) + max(B, link(backward bytes)) + R.
// Blocking over this is the best ratio any overlap can reach at that link.
double ideal_step(const Timing& calibration, double gbit) {
  const auto link = [&](int64_t bytes) { return static_cast<double>(bytes) * 8 / (gbit * 1e9); };
  return std::max(bench::median(calibration.forward),
                  link(calibration.forward_bytes + calibration.rest_bytes)) +
         std::max(bench::median(calibration.backward), link(calibration.backward_bytes)) +
         bench::median(calibration.rest);
}

// `rounds` x 2 timed steps per mode in `modes` (overlap_comm values), alternating by round,
// each round's first step untimed.
std::vector<Timing> run(int world, int stage, const parallel::SimulatedLink& link,
                        const std::vector<bool>& modes, int rounds) {
  std::vector<Timing> out(modes.size());
  parallel::run_thread_ranks(world, [&](parallel::Communicator& comm) {
    comm.set_simulated_link(link);
    const GptConfig cfg = model_config();
    std::vector<std::unique_ptr<Gpt>> models;
    std::vector<std::unique_ptr<parallel::ZeroOptimizer>> opts;
    for (const bool overlap : modes) {
      models.push_back(std::make_unique<Gpt>(cfg, 1));
      parallel::ZeroConfig zero;
      zero.stage = stage;
      // (stage 3) LayerNorm parameters and biases stay whole and every weight matrix is
      // gathered where used, as DeepSpeed's persistence threshold (1e5 elements by
      // default) keeps small parameters; at 0, their hundred gathers of a few hundred
      // bytes each step would each pay a meeting of the ranks.
      zero.stage3_param_persistence_threshold = 4096;
      zero.stage3_prefetch_bucket_size = 2'000'000;
      zero.overlap_comm = overlap;
      zero.reduce_bucket_size = 500'000;
      optim::OptimizerConfig adamw;
      opts.push_back(std::make_unique<parallel::ZeroOptimizer>(
          comm, *models.back(),
          optim::decay_groups(models.back()->named_parameters(), adamw.lr, 0.1, true, {}), adamw,
          zero));
    }
    Generator gen(17 + comm.rank());
    const Tensor x =  // (4, T) token ids
        rand({4, cfg.block_size}, gen, {}, 0.0, static_cast<double>(cfg.vocab_size)).to(DType::i32);
    const auto step = [&](size_t m, Timing* timing) {
      parallel::ZeroOptimizer& opt = *opts[m];
      opt.zero_grad();
      const auto start = Clock::now();
      const int64_t sent_before = comm.stats().total_bytes_sent();
      const Tensor loss = models[m]->loss(models[m]->forward(x), x);
      const auto backward_start = Clock::now();
      const int64_t sent_forward = comm.stats().total_bytes_sent();
      opt.backward(loss, 1.0, true);
      const auto rest_start = Clock::now();
      const int64_t sent_backward = comm.stats().total_bytes_sent();
      opt.clip_grad_norm(1.0);
      opt.step();
      if (timing != nullptr && comm.rank() == 0) {
        const auto end = Clock::now();
        const auto s = [](auto d) { return std::chrono::duration<double>(d).count(); };
        timing->step.push_back(s(end - start));
        timing->forward.push_back(s(backward_start - start));
        timing->backward.push_back(s(rest_start - backward_start));
        timing->rest.push_back(s(end - rest_start));
        timing->forward_bytes = sent_forward - sent_before;
        timing->backward_bytes = sent_backward - sent_forward;
        timing->rest_bytes = comm.stats().total_bytes_sent() - sent_backward;
      }
    };
    for (int round = 0; round < rounds; ++round) {
      for (size_t m = 0; m < modes.size(); ++m) {
        step(m, nullptr);
        for (int s = 0; s < 2; ++s) step(m, &out[m]);
        opts[m]->wait_for_parameters();  // the group is the next mode's
      }
    }
  });
  return out;
}

// A (pipe, 1, model) layout of pipe x model thread ranks.
struct Layout {
  int pipe, model;
  int world() const { return pipe * model; }
  std::string label() const { return std::to_string(pipe) + ",1," + std::to_string(model); }
};

// A layout's engine config: ZeRO-1, 16 sequences of T in 4 micro-batches.
parallel::EngineConfig layout_config(const Layout& layout, bool overlap) {
  const nlohmann::json doc = {
      {"train_batch_size", 16},
      {"gradient_accumulation_steps", 4},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.1}}}}},
      {"zero_optimization", {{"stage", 1}}},
      {"pipeline",
       {{"stages", layout.pipe}, {"partition_method", "uniform"}, {"overlap_transfers", overlap}}},
      {"tensor_parallel",
       {{"tp_size", layout.model}, {"overlap_comm", overlap}, {"batch_split", overlap ? 2 : 1}}}};
  JsonObjectReader root(doc, "overlap_bench");
  parallel::EngineConfig c = parallel::parse_engine_config(root);
  root.finish();
  parallel::finish_engine_config(c, layout.world());
  return c;
}

struct LayoutTiming {
  std::vector<double> step;  // rank 0's seconds per timed step
  int64_t bytes = 0;         // rank 0's bytes on the pipe and model groups per step
  int64_t pipe_bytes = 0;    // of them on the pipe group
  // Rank 0's model-group bytes of the step's forward passes and its seconds for them (an
  // eval batch of the same micro-batches).
  int64_t forward_model_bytes = 0;
  std::vector<double> forward;
};

// Note [Ideal overlap] for a layout: the forward passes F take at least as long as their
// row-parallel sums travel (each sub-layer needs its sum, so the link is their bound), and
// the rest of the step, backward with its input-gradient sums and the stage transfers
// hidden, and the optimizer, computes: max(F, link(forward model bytes)) + compute - F, and
// no less than the link's time for all of the step's bytes.
double ideal_layout_step(double compute_s, const LayoutTiming& calibration, double gbit) {
  const auto link = [&](int64_t bytes) { return static_cast<double>(bytes) * 8 / (gbit * 1e9); };
  const double forward = bench::median(calibration.forward);
  return std::max(std::max(forward, link(calibration.forward_model_bytes)) + compute_s - forward,
                  link(calibration.bytes));
}

// `rounds` x 2 timed steps per mode (overlap values), alternating by round, each round's
// first step untimed, on thread ranks laid out as `layout`.
std::vector<LayoutTiming> run_layout(const Layout& layout, const parallel::SimulatedLink& link,
                                     const std::vector<bool>& modes, int rounds) {
  std::vector<LayoutTiming> out(modes.size());
  parallel::run_thread_ranks(layout.world(), [&](parallel::Communicator& world) {
    parallel::ParallelGroups groups = parallel::make_parallel_groups(
        world, parallel::ProcessGrid::for_world(layout.world(), layout.pipe, layout.model));
    groups.pipe->set_simulated_link(link);
    groups.model->set_simulated_link(link);
    const GptSpec spec(model_config());
    ModelPlacement placement;
    placement.stages = layout.pipe;
    placement.stage = groups.coord.pipe;
    placement.partition_method = "uniform";
    placement.model_group = groups.model.get();
    std::vector<std::unique_ptr<LanguageModel>> models;
    std::vector<std::unique_ptr<parallel::Engine>> engines;
    for (const bool overlap : modes) {
      const parallel::EngineConfig config = layout_config(layout, overlap);
      placement.overlap_model_comm = config.tensor_parallel.overlap_comm;
      placement.model_batch_split = config.tensor_parallel.batch_split;
      models.push_back(spec.build(1, placement));
      engines.push_back(std::make_unique<parallel::Engine>(
          config, *models.back(),
          optim::decay_groups(models.back()->named_parameters(), config.optimizer.lr, 0.1, true,
                              {}),
          Device::cpu(), *groups.data, &groups));
    }
    Generator gen(17);
    std::vector<parallel::pipeline::MicroBatch> batches;
    for (int m = 0; m < 4; ++m) {
      const Tensor x = rand({4, model_config().block_size}, gen, {}, 0.0,
                            static_cast<double>(model_config().vocab_size))
                           .to(DType::i64);
      batches.push_back({x, x});
    }
    const auto bytes = [&] {
      return groups.pipe->stats().total_bytes_sent() + groups.model->stats().total_bytes_sent();
    };
    for (int round = 0; round < rounds; ++round) {
      for (size_t m = 0; m < modes.size(); ++m) {
        engines[m]->train_batch(batches);
        for (int s = 0; s < 2; ++s) {
          const int64_t before = bytes(), pipe_before = groups.pipe->stats().total_bytes_sent();
          const auto start = Clock::now();
          engines[m]->train_batch(batches);
          if (world.rank() == 0) {
            out[m].step.push_back(seconds_since(start));
            out[m].bytes = bytes() - before;
            out[m].pipe_bytes = groups.pipe->stats().total_bytes_sent() - pipe_before;
          }
        }
        const int64_t model_before = groups.model->stats().total_bytes_sent();
        const auto start = Clock::now();
        engines[m]->eval_batch(batches);
        if (world.rank() == 0) {
          out[m].forward.push_back(seconds_since(start));
          out[m].forward_model_bytes = groups.model->stats().total_bytes_sent() - model_before;
        }
      }
    }
  });
  return out;
}

// The cores this process may run on: its affinity mask, which a container or taskset narrows.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

// One row of the table: what was calibrated (compute time and bytes), the link set from
// them, both modes' median steps, their ratio, and the ideal ratio (0: not computed).
void print_row(const std::string& label, double compute_s, int64_t bytes, double gbit,
               double blocking_s, double overlapped_s, double ideal_s) {
  std::printf("%-5s | %7.1f ms %7.2f MB %5.2f Gb/s | %6.1f ms %6.1f ms %7.3f", label.c_str(),
              compute_s * 1e3, static_cast<double>(bytes) / 1e6, gbit, blocking_s * 1e3,
              overlapped_s * 1e3, blocking_s / overlapped_s);
  if (ideal_s > 0) {
    std::printf(" %7.3f\n", blocking_s / ideal_s);
  } else {
    std::printf(" %7s\n", "-");
  }
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(
      argc, argv, {{"world", Flag::kValue}, {"stages", Flag::kValue}, {"steps", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const int world = static_cast<int>(flags.get_int("world", 4));
  const std::vector<int64_t> stages = flags.get_int_list("stages", "0,1,2,3");
  const int rounds = static_cast<int>((flags.get_int("steps", 6) + 1) / 2);
  if (world < 2 || world > 16) throw cli::UsageError("--world expected 2..16");
  if (rounds < 1) throw cli::UsageError("--steps expected at least 1");
  for (const int64_t s : stages) {
    if (s < 0 || s > 3) throw cli::UsageError("--stages expected stages in 0..3");
  }
  set_num_threads(1);  // ranks are threads already (run_thread_ranks passes the count on)
  // Ranks beyond the cores share them, and so do their communication workers: README's
  // overlap section says what that does to the ratios.
  std::printf(
      "overlap_bench: GPT %lld parameters, %d thread ranks on %d cores; medians of %d steps per "
      "mode\n",
      static_cast<long long>(model_config().num_parameters()), world, usable_cores(), 2 * rounds);
  std::printf("%-5s | %9s %10s %9s | %9s %9s %7s %7s\n", "stage", "compute", "sent", "link",
              "blocking", "overlap", "ratio", "ideal");
  for (const int64_t stage : stages) {
    const Timing calibration = run(world, static_cast<int>(stage), {}, {false}, rounds)[0];
    const double compute = bench::median(calibration.step);
    // Gbit/s at which the step's bytes take `compute` seconds.
    const double gbit = static_cast<double>(calibration.bytes()) * 8 / compute / 1e9;
    const std::vector<Timing> timed =
        run(world, static_cast<int>(stage), {.gbit_per_s = gbit}, {false, true}, rounds);
    const double blocking = bench::median(timed[0].step);
    const double overlapped = bench::median(timed[1].step);
    print_row(std::to_string(stage), compute, calibration.bytes(), gbit, blocking, overlapped,
              ideal_step(calibration, gbit));
  }
  // The layouts: the link carries rank 0's pipe and model bytes in the step's computing time.
  std::string sums;
  for (const Layout& layout : {Layout{2, 2}, Layout{1, 2}}) {
    const LayoutTiming calibration = run_layout(layout, {}, {false}, rounds)[0];
    const double compute = bench::median(calibration.step);
    const double gbit = static_cast<double>(calibration.bytes) * 8 / compute / 1e9;
    const std::vector<LayoutTiming> timed =
        run_layout(layout, {.gbit_per_s = gbit}, {false, true}, rounds);
    const double blocking = bench::median(timed[0].step);
    const double overlapped = bench::median(timed[1].step);
    print_row(layout.label(), compute, calibration.bytes, gbit, blocking, overlapped,
              ideal_layout_step(compute, calibration, gbit));
    char line[160];
    std::snprintf(line, sizeof line, "%s%s: pipe %.2f MB, the forward's model-group sums %.2f MB",
                  sums.empty() ? "" : "; ", layout.label().c_str(),
                  static_cast<double>(calibration.pipe_bytes) / 1e6,
                  static_cast<double>(calibration.forward_model_bytes) / 1e6);
    sums += line;
  }
  std::printf(
      "(compute: rank 0's step without a link; sent: its bytes per step, for a layout on the "
      "pipe and model groups (%s); ideal: blocking over the step with every byte hidden where "
      "it can be, Note [Ideal overlap])\n",
      sums.c_str());
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool("overlap_bench", tessera::kUsage, tessera::bench_main, argc, argv);
}
