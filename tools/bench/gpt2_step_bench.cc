// GPT-2 124M training-step benchmark: forward, backward and AdamW on random tokens, fp32,
// against PyTorch running the same model on the same machine in the same invocation
// (tools/bench/gpt2_step_torch.py), and against the measured FMA peak.
//
//   bazel run //tools/bench:gpt2_step_bench [-- --steps 5 --threads 2 --no-torch]
//
// Note [GPT-2 step benchmark accounting]
// FLOPs per step are tokens x (6N + 12 L H Q T) (PaLM appendix B; N = all parameters with
// the padded vocabulary); the forward is a third of that, the backward two thirds. The
// memory target is peak RSS <= 1.3 x (16 bytes x N + activations): 16 bytes are the fp32
// parameter, gradient and two Adam moments. "Activations" is measured, not modelled: the
// bytes the CPU allocator holds after forward + loss minus those it held before the forward
// (gradients dropped), i.e. every tensor the graph saved for backward plus the logits.
// An llm.c-style count of the same tensors is printed beside it as a cross-check.
//
// The PyTorch reference runs as a coprocess (tools/bench/torch_reference.h) that takes its
// timed steps in rounds alternating with ours (--round steps each), so a drift in the shared
// host's speed hits both; the ratio is of the two medians over all rounds, and the spread
// of the per-round ratios is printed beside it.
// The FMA peak (tools/perf/fma_peak.h) is measured twice, before and after the timed steps,
// and the shares use the higher value: on a shared host the two can differ by 20%, and the
// higher one gives the lower, conservative share. The PyTorch ratio is only called met or
// not when torch ran on an optimized BLAS (OpenBLAS, MKL or BLIS): Debian's default
// alternative is the reference BLAS, about 25x slower than OpenBLAS on this step, which
// would make any ratio meaningless.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "models/gpt2/gpt.h"
#include "optim/adam.h"
#include "tools/bench/gpt2_bf16_step.h"
#include "tools/bench/gpt2_step_inputs.h"
#include "tools/bench/python_reference.h"
#include "tools/bench/stats.h"
#include "tools/bench/step_gemms.h"
#include "tools/bench/torch_reference.h"
#include "tools/cli/flags.h"
#include "tools/perf/fma_peak.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    R"(usage: gpt2_step_bench [--dtype f32|bf16] [--steps N] [--round N] [--warmup N]
                       [--threads N] [--batch B] [--seq T] [--torch-script FILE]
                       [--python EXE] [--no-torch]

Times GPT-2 124M training steps (fp32, AdamW) and compares with PyTorch on this machine.

  --dtype bf16         instead: the bf16 mixed-precision step (f32 masters) against our
                       fp32 step and PyTorch's fp32 and CPU-autocast bf16 steps, in turns

  --steps N            timed steps of each framework (default 10)
  --round N            steps per round: the frameworks alternate rounds (default 2)
  --warmup N           untimed steps first (default 2)
  --threads N          threads for both frameworks (default 2)
  --batch B, --seq T   tokens per step B x T (default 4 x 64)
  --torch-script FILE  the PyTorch reference (default: tools/bench/gpt2_step_torch.py in
                       $BUILD_WORKSPACE_DIRECTORY, the runfiles, or the current directory)
  --python EXE         the interpreter with torch (default /usr/bin/python3)
  --torch-blas DIR     a directory put first on the reference's LD_LIBRARY_PATH to pick
                       the BLAS torch loads, or "system" (default: Debian's OpenMP build of
                       OpenBLAS, /usr/lib/x86_64-linux-gnu/openblas-openmp, when present:
                       the pthread build adds a second threading runtime to torch's OpenMP
                       and runs the step ~1.4x slower)
  --no-torch           skip the reference
  --perf-ctl FIFO      write "enable" / "disable" to FIFO around the timed steps, for
                       perf record --control fifo:FIFO -D -1 (a profile of the steps only)
)";

using bench::mean;
using bench::median;

// Resident set size now (/proc/self/statm) and its high-water mark (getrusage), in bytes.
int64_t current_rss() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

AllocatorStats cpu_stats() { return allocator_for(Device::cpu()).stats(); }

// Per-step wall times of the phases, seconds.
struct Timings {
  std::vector<double> step, forward, backward, optimizer;
};

// The tensors a GPT-2 training step keeps from forward to backward, counted the way llm.c's
// ActivationTensors are (floats): per layer ln_1, qkv, attention output, attention
// projection, residual, ln_2, fc, gelu, fc projection, residual (18 BTC), LayerNorm
// statistics (4 BT), pre-softmax scores and probabilities (2 BHTT); then the embedding
// sum, ln_f, logits and their softmax (2 BTVp).
double llmc_activation_bytes(const GptConfig& c, int64_t b, int64_t t) {
  const double bt = static_cast<double>(b * t), btc = bt * static_cast<double>(c.n_embd);
  const double bhtt = static_cast<double>(b * c.n_head * t * t);
  const double per_layer = 18 * btc + 4 * bt + 2 * bhtt;
  const double floats = static_cast<double>(c.n_layer) * per_layer + 2 * btc + 2 * bt +
                        2 * bt * static_cast<double>(c.padded_vocab_size());
  return 4 * floats;
}

// Whether the BLAS torch loaded (the reference's "blas" field, library paths) is an
// optimized one rather than the reference implementation.
bool optimized_blas(std::string blas) {
  std::transform(blas.begin(), blas.end(), blas.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const char* name : {"openblas", "mkl", "blis"}) {
    if (blas.find(name) != std::string::npos) return true;
  }
  return false;
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"dtype", Flag::kValue},
                          {"steps", Flag::kValue},
                          {"round", Flag::kValue},
                          {"warmup", Flag::kValue},
                          {"threads", Flag::kValue},
                          {"batch", Flag::kValue},
                          {"seq", Flag::kValue},
                          {"torch-script", Flag::kValue},
                          {"python", Flag::kValue},
                          {"torch-blas", Flag::kValue},
                          {"no-torch", Flag::kSwitch},
                          {"perf-ctl", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const int64_t steps = flags.get_int("steps", 10), warmup = flags.get_int("warmup", 2);
  const int64_t round = flags.get_int("round", 2);
  const int64_t threads = flags.get_int("threads", 2);
  const int64_t batch = flags.get_int("batch", 4), seq = flags.get_int("seq", 64);
  if (steps < 1 || round < 1 || warmup < 0 || threads < 1 || batch < 1 || seq < 1 || seq > 1024) {
    throw cli::UsageError(
        "expected --steps >= 1, --round >= 1, --warmup >= 0, --threads >= 1, --batch >= 1, "
        "--seq in [1, 1024]");
  }
  const std::string dtype = flags.get("dtype", "f32");
  if (dtype != "f32" && dtype != "bf16") {
    throw cli::UsageError("expected --dtype f32 or bf16, found " + dtype);
  }
  set_num_threads(static_cast<int>(threads));

  std::optional<bench::TorchReferenceOptions> torch_options;
  if (!flags.has("no-torch")) {
    const std::string kOpenmpBlas = "/usr/lib/x86_64-linux-gnu/openblas-openmp";
    std::string blas = flags.get("torch-blas", fs::exists(kOpenmpBlas) ? kOpenmpBlas : "system");
    if (blas == "system") blas.clear();
    bench::TorchReferenceOptions& options = torch_options.emplace();
    options.python = flags.get("python", "/usr/bin/python3");
    options.script = bench::find_script(flags.get("torch-script"), argv[0], "gpt2_step_torch.py");
    options.blas_dir = blas;
    options.batch = batch;
    options.seq = seq;
    options.warmup = warmup;
    options.threads = static_cast<int>(threads);
  }
  if (dtype == "bf16") {
    return bench::run_bf16_step_comparison(
        {steps, round, warmup, static_cast<int>(threads), batch, seq, torch_options});
  }
  // The reference builds its model and takes its warm-up steps first, while we wait.
  std::optional<bench::TorchReference> torch;
  if (torch_options) {
    std::printf("starting the PyTorch reference: %s\n", torch_options->script.c_str());
    std::fflush(stdout);
    torch.emplace(*torch_options);
  }

  const int64_t rss_start = current_rss();
  const GptConfig cfg = GptConfig::preset("gpt2");
  Gpt model(cfg, /*seed=*/1337);
  const int64_t rss_model = current_rss();
  const AllocatorStats after_model = cpu_stats();
  optim::Adam opt(optim::decay_groups(model.named_parameters(), 1e-4, 0.1, true, {}),
                  optim::AdamOptions{});
  const auto [idx, targets] = bench::random_step_tokens(cfg, batch, seq);

  const double n_params = static_cast<double>(cfg.num_parameters());
  const double tokens = static_cast<double>(batch * seq);
  const double flops_step = bench::step_flops(cfg, batch, seq);

  std::printf(
      "GPT-2 124M training step: %.0f parameters, B=%lld T=%lld (%.0f tokens), fp32, "
      "AdamW, %lld threads; %lld warm-up + %lld timed steps\n",
      n_params, static_cast<long long>(batch), static_cast<long long>(seq), tokens,
      static_cast<long long>(threads), static_cast<long long>(warmup),
      static_cast<long long>(steps));
  std::printf("FLOPs per step: %.1f GFLOP (PaLM: tokens x (6N + 12 L H Q T))\n", flops_step / 1e9);
  std::fflush(stdout);

  // perf's control FIFO, opened before the steps (perf holds its other end already).
  FILE* perf_ctl = nullptr;
  if (const std::optional<std::string> path = flags.get("perf-ctl")) {
    perf_ctl = std::fopen(path->c_str(), "w");
    TS_CHECK(perf_ctl != nullptr, "cannot open the perf control FIFO ", *path);
  }
  auto perf_command = [&](const char* cmd) {
    if (perf_ctl == nullptr) return;
    std::fputs(cmd, perf_ctl);
    std::fflush(perf_ctl);
  };
  // One training step; returns its phase times.
  struct StepResult {
    double step, forward, backward, optimizer, loss;
    double before_forward, activations;  // allocator bytes
  };
  auto run_step = [&] {
    auto d = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    const auto t0 = Clock::now();
    opt.zero_grad();
    const double before_forward = static_cast<double>(cpu_stats().allocated);
    const auto t1 = Clock::now();
    const Tensor loss = model.loss(model.forward(idx), targets);
    const auto t2 = Clock::now();
    const double after_forward = static_cast<double>(cpu_stats().allocated);
    backward(loss);
    const auto t3 = Clock::now();
    opt.step();
    const auto t4 = Clock::now();
    return StepResult{d(t0, t4),
                      d(t1, t2),
                      d(t2, t3),
                      d(t3, t4),
                      loss.to_vector<double>()[0],
                      before_forward,
                      after_forward - before_forward};
  };
  // The peak is measured before and after the steps; the shares use the higher of the two
  // (Note [GPT-2 step benchmark accounting]).
  const double peak_before = perf::measure_fma_peak(static_cast<int>(threads), 0.5);
  Timings t;
  double first_loss = 0, last_loss = 0;
  double activations = 0, peak_allocated = 0, grads_and_state = 0;
  for (int64_t s = 0; s < warmup; ++s) {
    const StepResult r = run_step();
    if (s == 0) first_loss = r.loss;
  }
  // Rounds of `round` steps, ours then the reference's; the ratio of each round's medians.
  std::vector<double> round_ratios;
  for (int64_t done = 0; done < steps; done += round) {
    const int64_t n = std::min(round, steps - done);
    perf_command("enable\n");
    std::vector<double> ours;
    for (int64_t s = 0; s < n; ++s) {
      allocator_for(Device::cpu()).reset_peak();
      const StepResult r = run_step();
      if (warmup == 0 && done + s == 0) first_loss = r.loss;
      last_loss = r.loss;
      ours.push_back(r.step);
      t.step.push_back(r.step);
      t.forward.push_back(r.forward);
      t.backward.push_back(r.backward);
      t.optimizer.push_back(r.optimizer);
      activations = r.activations;
      peak_allocated = static_cast<double>(cpu_stats().peak_allocated);
      grads_and_state = r.before_forward;
    }
    perf_command("disable\n");
    if (torch && torch->ok()) {
      if (const std::optional<nlohmann::json> theirs = torch->steps(n)) {
        round_ratios.push_back(median((*theirs)["step_s"].get<std::vector<double>>()) /
                               median(ours));
      }
    }
  }
  if (perf_ctl != nullptr) std::fclose(perf_ctl);
  const int64_t rss_peak = peak_resident_bytes();
  const double reserved = static_cast<double>(cpu_stats().reserved);
  const double peak_after = perf::measure_fma_peak(static_cast<int>(threads), 0.5);
  const double peak = std::max(peak_before, peak_after);

  const double step_med = median(t.step), step_mean = mean(t.step);
  const double tok_s = tokens / step_med;
  const double mfu = flops_step / step_med / peak;
  std::printf("losses: first step %.4f, last step %.4f (ln 50257 = 10.825)\n", first_loss,
              last_loss);
  std::printf(
      "measured FMA peak: %.1f GFLOP/s on %lld threads (%.1f before the steps, %.1f after; "
      "the shares below use the higher)\n",
      peak / 1e9, static_cast<long long>(threads), peak_before / 1e9, peak_after / 1e9);

  std::printf("\ntimed steps (ms): total = forward + loss | backward | AdamW | zero_grad\n");
  for (size_t i = 0; i < t.step.size(); ++i) {
    std::printf("  step %zu: %8.1f = %8.1f | %8.1f | %8.1f | %6.1f\n", i + 1, 1e3 * t.step[i],
                1e3 * t.forward[i], 1e3 * t.backward[i], 1e3 * t.optimizer[i],
                1e3 * (t.step[i] - t.forward[i] - t.backward[i] - t.optimizer[i]));
  }
  // Where the time goes (median of the timed steps).
  const double f = median(t.forward), b = median(t.backward), o = median(t.optimizer);
  std::printf("\ntessera time breakdown (median ms; GFLOP/s; share of the step)\n");
  std::printf("  forward + loss   %8.1f ms  %7.1f GFLOP/s  %5.1f%%\n", 1e3 * f,
              flops_step / 3 / f / 1e9, 100 * f / step_med);
  std::printf("  backward         %8.1f ms  %7.1f GFLOP/s  %5.1f%%\n", 1e3 * b,
              2 * flops_step / 3 / b / 1e9, 100 * b / step_med);
  std::printf("  AdamW step       %8.1f ms  %7.1f GB/s     %5.1f%%\n", 1e3 * o,
              7 * 4 * n_params / o / 1e9, 100 * o / step_med);
  std::printf("  (AdamW traffic: read p, g, m, v and write p, m, v: 28 bytes per parameter)\n");

  // GEMMs alone, alternating with steps (step_gemms.h, Note [GEMM share of the step]); after the
  // memory high-water mark was taken, since the GEMM operands need memory of their own.
  const bench::StepGemms gemms(cfg, batch * seq);
  constexpr int kRounds = 3;
  std::array<std::vector<double>, bench::StepGemms::kGroups> group_s;
  std::vector<double> round_step, round_gemm;
  for (int r = 0; r < kRounds; ++r) {
    round_step.push_back(run_step().step);
    const std::array<double, bench::StepGemms::kGroups> g = gemms.run();
    for (int i = 0; i < bench::StepGemms::kGroups; ++i) group_s[i].push_back(g[i]);
    round_gemm.push_back(std::accumulate(g.begin(), g.end(), 0.0));
  }
  std::printf(
      "\nthe step's GEMMs timed alone (kernels::matmul; median of %d rounds, each one step\n"
      "then its GEMMs)\n",
      kRounds);
  std::printf("  %-22s %6s %9s %9s %9s\n", "", "calls", "GFLOP", "ms", "GFLOP/s");
  double gemm_flops = 0;
  for (int i = 0; i < bench::StepGemms::kGroups; ++i) {
    const double sec = median(group_s[i]);
    gemm_flops += gemms.flops(i);
    std::printf("  %-22s %6lld %9.1f %9.1f %9.1f\n", bench::StepGemms::kNames[i],
                static_cast<long long>(gemms.calls(i)), gemms.flops(i) / 1e9, 1e3 * sec,
                gemms.flops(i) / sec / 1e9);
  }
  const double gemm_s = median(round_gemm), round_step_s = median(round_step);
  std::printf("  %-22s %6s %9.1f %9.1f %9.1f  (%.1f%% of FMA peak)\n", "all GEMMs", "",
              gemm_flops / 1e9, 1e3 * gemm_s, gemm_flops / gemm_s / 1e9,
              100 * gemm_flops / gemm_s / peak);
  std::printf("  step in these rounds %.1f ms: GEMMs %.1f%%, everything else %.1f ms (%.1f%%)\n",
              1e3 * round_step_s, 100 * gemm_s / round_step_s, 1e3 * (round_step_s - gemm_s),
              100 * (round_step_s - gemm_s) / round_step_s);

  // Memory.
  const double target = 1.3 * (16 * n_params + activations);
  std::printf("\ntessera memory\n");
  std::printf("  RSS before the model            %9.1f MiB\n", mib(static_cast<double>(rss_start)));
  std::printf("  RSS after building the model    %9.1f MiB (parameters: %.1f MiB)\n",
              mib(static_cast<double>(rss_model)), mib(4 * n_params));
  std::printf("  allocator after the model       %9.1f MiB allocated, %.1f MiB reserved\n",
              mib(static_cast<double>(after_model.allocated)),
              mib(static_cast<double>(after_model.reserved)));
  std::printf("  allocator before forward        %9.1f MiB (parameters + Adam moments)\n",
              mib(grads_and_state));
  std::printf("  activations (measured)          %9.1f MiB (llm.c-style count: %.1f MiB)\n",
              mib(activations), mib(llmc_activation_bytes(cfg, batch, seq)));
  std::printf("  allocator peak in a step        %9.1f MiB\n", mib(peak_allocated));
  std::printf("  allocator reserved (with cache) %9.1f MiB\n", mib(reserved));
  std::printf("  peak RSS                        %9.1f MiB\n", mib(static_cast<double>(rss_peak)));
  std::printf("  target 1.3 x (16 B x N + act.)  %9.1f MiB  -> peak RSS / target = %.3f\n",
              mib(target), static_cast<double>(rss_peak) / target);
  std::fflush(stdout);

  std::optional<nlohmann::json> ref;
  if (torch) {
    ref = torch->finish();
    if (ref) {
      std::printf(
          "\nPyTorch %s, %d threads, BLAS %s (OPENBLAS_CORETYPE=%s); its steps alternated with "
          "ours in rounds of %lld\n",
          (*ref)["torch"].get<std::string>().c_str(), (*ref)["threads"].get<int>(),
          (*ref)["blas"].get<std::string>().c_str(),
          (*ref)["openblas_coretype"].get<std::string>().c_str(), static_cast<long long>(round));
    } else {
      std::printf("\nPyTorch reference unavailable: %s\n", torch->why().c_str());
    }
  }

  std::printf("\n%-28s %14s", "", "tessera");
  if (ref) std::printf(" %14s", ("torch " + (*ref)["torch"].get<std::string>()).c_str());
  std::printf("\n");
  auto row = [&](const char* name, double ours, const char* key, double scale, const char* fmt) {
    std::printf("%-28s ", name);
    std::printf(fmt, ours);
    if (ref && key != nullptr) {
      std::printf(" ");
      std::printf(fmt, (*ref)[key].get<double>() * scale);
    }
    std::printf("\n");
  };
  row("ms/step (median)", 1e3 * step_med, "median_s", 1e3, "%14.1f");
  row("ms/step (mean)", 1e3 * step_mean, "mean_s", 1e3, "%14.1f");
  row("  forward + loss ms", 1e3 * f, "forward_s", 1e3, "%14.1f");
  row("  backward ms", 1e3 * b, "backward_s", 1e3, "%14.1f");
  row("  optimizer ms", 1e3 * o, "optimizer_s", 1e3, "%14.1f");
  std::printf("%-28s %14.1f", "tokens/s", tok_s);
  double torch_tok_s = 0;
  if (ref) {
    torch_tok_s = tokens / (*ref)["median_s"].get<double>();
    std::printf(" %14.1f", torch_tok_s);
  }
  std::printf("\n");
  if (ref && !round_ratios.empty()) {
    std::printf("%-28s %14s %7.2fx-%.2fx\n", "  ratio in each round", "",
                *std::min_element(round_ratios.begin(), round_ratios.end()),
                *std::max_element(round_ratios.begin(), round_ratios.end()));
  }
  std::printf("%-28s %13.1f%%", "share of FMA peak", 100 * mfu);
  if (ref) std::printf(" %13.1f%%", 100 * flops_step / (*ref)["median_s"].get<double>() / peak);
  std::printf("\n");
  row("RSS at start MiB", mib(static_cast<double>(rss_start)), "rss_start_bytes", 1.0 / (1 << 20),
      "%14.1f");
  row("peak RSS MiB", mib(static_cast<double>(rss_peak)), "peak_rss_bytes", 1.0 / (1 << 20),
      "%14.1f");
  // Different random tokens and init: the losses only show that both train.
  if (ref) row("last loss (own tokens)", last_loss, "loss", 1.0, "%14.4f");

  std::printf("\ntargets\n");
  if (ref) {
    const double ratio = tok_s / torch_tok_s;
    const std::string blas = (*ref)["blas"].get<std::string>();
    if (optimized_blas(blas)) {
      std::printf("  tokens/s vs PyTorch   %6.2fx  (target >= 2x)     %s\n", ratio,
                  ratio >= 2 ? "met" : "NOT met");
    } else {
      std::printf(
          "  tokens/s vs PyTorch   %6.2fx  not comparable: expected torch on OpenBLAS, MKL or "
          "BLIS, found %s (apt-get install libopenblas0-openmp)\n",
          ratio, blas.c_str());
    }
  } else {
    std::printf("  tokens/s vs PyTorch   reference unavailable\n");
  }
  std::printf("  share of FMA peak     %5.1f%%   (target >= 60%%)    %s\n", 100 * mfu,
              mfu >= 0.6 ? "met" : "NOT met");
  std::printf("  peak RSS / target     %6.3f   (target <= 1)      %s\n",
              static_cast<double>(rss_peak) / target, rss_peak <= target ? "met" : "NOT met");
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool("gpt2_step_bench", tessera::kUsage, tessera::bench_main, argc,
                                argv);
}
