#include "tools/bench/gpt2_bf16_step.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "core/factories.h"
#include "kernels/cpu/bf16_gemm.h"
#include "models/gpt2/gpt.h"
#include "optim/adam.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tools/bench/gpt2_step_inputs.h"
#include "tools/bench/stats.h"
#include "tools/bench/step_gemms.h"
#include "tools/perf/fma_peak.h"

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The per-step phase times of one contender, seconds, and its losses.
struct Column {
  explicit Column(std::string column_name = "") : name(std::move(column_name)) {}
  std::string name;
  std::vector<double> step, forward, backward, optimizer;
  double first_loss = 0, last_loss = 0;
  bool has_loss = false;
};

// One of our steps: its phase times and loss.
struct Phases {
  double forward, backward, optimizer, loss;
};

void record(Column& c, const Phases& p) {
  c.forward.push_back(p.forward);
  c.backward.push_back(p.backward);
  c.optimizer.push_back(p.optimizer);
  c.step.push_back(p.forward + p.backward + p.optimizer);
  if (!c.has_loss) c.first_loss = p.loss;
  c.has_loss = true;
  c.last_loss = p.loss;
}

// Appends a PyTorch TORCH_STEPS object's times to `c`.
void record(Column& c, const nlohmann::json& steps) {
  for (const char* key : {"step_s", "forward_s", "backward_s", "optimizer_s"}) {
    const auto v = steps[key].get<std::vector<double>>();
    std::vector<double>& to = key == std::string("step_s")       ? c.step
                              : key == std::string("forward_s")  ? c.forward
                              : key == std::string("backward_s") ? c.backward
                                                                 : c.optimizer;
    to.insert(to.end(), v.begin(), v.end());
  }
}

}  // namespace

int run_bf16_step_comparison(const Bf16StepOptions& o) {
  // The references build their models and take their warm-up steps while we build ours.
  std::vector<std::unique_ptr<TorchReference>> torch;
  if (o.torch) {
    for (const char* dtype : {"f32", "bf16"}) {
      TorchReferenceOptions t = *o.torch;
      t.dtype = dtype;
      std::printf("starting the PyTorch reference (%s): %s\n", dtype, t.script.c_str());
      std::fflush(stdout);
      torch.push_back(std::make_unique<TorchReference>(t));
    }
  }

  const GptConfig cfg = GptConfig::preset("gpt2");
  const int64_t bt = o.batch * o.seq;
  const auto [idx, targets] = random_step_tokens(cfg, o.batch, o.seq);

  // fp32: the model and AdamW as gpt2_step_bench's.
  Gpt f32_model(cfg, /*seed=*/1337);
  optim::Adam f32_opt(optim::decay_groups(f32_model.named_parameters(), 1e-4, 0.1, true, {}),
                      optim::AdamOptions{});
  // bf16: the same initial weights, rounded, with f32 masters (Note [bf16 step benchmark]).
  Gpt bf16_model(cfg, /*seed=*/1337);
  bf16_model.to(Device::cpu(), DType::bf16);
  const auto comms = parallel::make_thread_group(1);
  optim::OptimizerConfig adamw;
  adamw.lr = 1e-4;
  adamw.weight_decay = 0.1;
  parallel::ZeroOptimizer bf16_opt(
      *comms[0], bf16_model,
      optim::decay_groups(bf16_model.named_parameters(), adamw.lr, adamw.weight_decay, true, {}),
      adamw, parallel::ZeroConfig{}, parallel::MixedPrecision(DType::bf16));

  const auto f32_step = [&] {
    f32_opt.zero_grad();
    const auto t0 = Clock::now();
    const Tensor loss = f32_model.loss(f32_model.forward(idx), targets);
    const auto t1 = Clock::now();
    backward(loss);
    const auto t2 = Clock::now();
    f32_opt.step();
    const auto t3 = Clock::now();
    return Phases{seconds(t0, t1), seconds(t1, t2), seconds(t2, t3), loss.item<double>()};
  };
  const auto bf16_step = [&] {
    bf16_opt.zero_grad();
    const auto t0 = Clock::now();
    const Tensor loss = bf16_model.loss(bf16_model.forward(idx), targets);
    const auto t1 = Clock::now();
    bf16_opt.backward(loss, 1.0, /*boundary=*/true);
    const auto t2 = Clock::now();
    bf16_opt.step();
    const auto t3 = Clock::now();
    return Phases{seconds(t0, t1), seconds(t1, t2), seconds(t2, t3), loss.item<double>()};
  };

  const double tokens = static_cast<double>(bt);
  const double flops_step = step_flops(cfg, o.batch, o.seq);
  std::printf(
      "GPT-2 124M training step, B=%lld T=%lld, %d threads: bf16 mixed precision against fp32; "
      "%lld warm-up + %lld timed steps each, in rounds of %lld\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.threads,
      static_cast<long long>(o.warmup), static_cast<long long>(o.steps),
      static_cast<long long>(o.round));
  std::fflush(stdout);

  const double fma_before = perf::measure_fma_peak(o.threads, 0.5);
  const double bf16_before = perf::measure_bf16_peak(o.threads, 0.5);
  Column ours_f32{"tessera f32"}, ours_bf16{"tessera bf16"};
  Column warm_f32, warm_bf16;  // warm-up steps: their first losses only
  for (int64_t s = 0; s < o.warmup; ++s) {
    record(warm_f32, f32_step());
    record(warm_bf16, bf16_step());
  }
  std::vector<Column> theirs = {Column{"torch f32"}, Column{"torch bf16"}};
  std::vector<double> round_speedups;  // our f32 median / our bf16 median, per round
  for (int64_t done = 0; done < o.steps; done += o.round) {
    const int64_t n = std::min(o.round, o.steps - done);
    std::vector<double> f32_round, bf16_round;
    for (int64_t s = 0; s < n; ++s) {
      record(ours_f32, f32_step());
      f32_round.push_back(ours_f32.step.back());
    }
    for (int64_t s = 0; s < n; ++s) {
      record(ours_bf16, bf16_step());
      bf16_round.push_back(ours_bf16.step.back());
    }
    round_speedups.push_back(median(f32_round) / median(bf16_round));
    for (size_t i = 0; i < torch.size(); ++i) {
      if (!torch[i]->ok()) continue;
      if (const std::optional<nlohmann::json> steps = torch[i]->steps(n)) record(theirs[i], *steps);
    }
  }
  const double fma_peak = std::max(fma_before, perf::measure_fma_peak(o.threads, 0.5));
  const double bf16_peak = std::max(bf16_before, perf::measure_bf16_peak(o.threads, 0.5));
  if (o.warmup > 0) {
    ours_f32.first_loss = warm_f32.first_loss;
    ours_bf16.first_loss = warm_bf16.first_loss;
  }
  for (size_t i = 0; i < torch.size(); ++i) {
    if (const std::optional<nlohmann::json> result = torch[i]->finish()) {
      theirs[i].first_loss = theirs[i].last_loss = (*result)["loss"].get<double>();
      theirs[i].has_loss = true;
      if (i == 0) {
        std::printf("PyTorch %s, BLAS %s\n", (*result)["torch"].get<std::string>().c_str(),
                    (*result)["blas"].get<std::string>().c_str());
      }
    } else {
      std::printf("PyTorch reference (%s) unavailable: %s\n", i == 0 ? "f32" : "bf16",
                  torch[i]->why().c_str());
    }
  }
  std::printf(
      "measured peaks on %d threads: f32 FMA %.1f GFLOP/s, bf16 %s %.1f GFLOP/s (the higher "
      "of before and after the steps)\n",
      o.threads, fma_peak / 1e9,
      !kernels::cpu::kHaveBf16Gemm                                        ? "(f32 FMA)"
      : kernels::cpu::best_bf16_kernel() == kernels::cpu::Bf16Kernel::amx ? "AMX tdpbf16ps"
                                                                          : "vdpbf16ps",
      bf16_peak / 1e9);

  std::vector<const Column*> columns = {&ours_f32, &ours_bf16};
  for (const Column& c : theirs) {
    if (!c.step.empty()) columns.push_back(&c);
  }
  std::printf("\n%-22s", "");
  for (const Column* c : columns) std::printf(" %13s", c->name.c_str());
  std::printf("\n");
  const auto row = [&](const char* name, const std::function<double(const Column&)>& value,
                       const char* format) {
    std::printf("%-22s", name);
    for (const Column* c : columns) std::printf(format, value(*c));
    std::printf("\n");
  };
  row(
      "ms/step (median)", [](const Column& c) { return 1e3 * median(c.step); }, " %13.1f");
  row(
      "  forward + loss", [](const Column& c) { return 1e3 * median(c.forward); }, " %13.1f");
  row(
      "  backward", [](const Column& c) { return 1e3 * median(c.backward); }, " %13.1f");
  row(
      "  optimizer", [](const Column& c) { return 1e3 * median(c.optimizer); }, " %13.1f");
  row(
      "tokens/s", [&](const Column& c) { return tokens / median(c.step); }, " %13.0f");
  row(
      "share of own peak %",
      [&](const Column& c) {
        const bool bf16 = c.name.find("bf16") != std::string::npos;
        return 100 * flops_step / median(c.step) / (bf16 ? bf16_peak : fma_peak);
      },
      " %13.1f");
  row(
      "last loss", [](const Column& c) { return c.last_loss; }, " %13.4f");
  std::printf("(first losses, same weights and tokens: f32 %.4f, bf16 %.4f)\n", ours_f32.first_loss,
              ours_bf16.first_loss);

  // The step's GEMMs alone in both dtypes (tools/bench/step_gemms.h), after the steps.
  const StepGemms gemms_f32(cfg, bt), gemms_bf16(cfg, bt, DType::bf16);
  std::array<std::vector<double>, StepGemms::kGroups> f32_s, bf16_s;
  for (int r = 0; r < 3; ++r) {
    const auto f = gemms_f32.run(), h = gemms_bf16.run();
    for (int g = 0; g < StepGemms::kGroups; ++g) {
      f32_s[g].push_back(f[g]);
      bf16_s[g].push_back(h[g]);
    }
  }
  std::printf("\nthe step's GEMMs alone (kernels::matmul, median of 3 passes)\n");
  std::printf("  %-22s %9s %10s %10s %12s\n", "", "GFLOP", "f32 ms", "bf16 ms", "bf16 GFLOP/s");
  double f32_total = 0, bf16_total = 0;
  for (int g = 0; g < StepGemms::kGroups; ++g) {
    const double f = median(f32_s[g]), h = median(bf16_s[g]);
    f32_total += f;
    bf16_total += h;
    std::printf("  %-22s %9.1f %10.1f %10.1f %12.1f\n", StepGemms::kNames[g],
                gemms_bf16.flops(g) / 1e9, 1e3 * f, 1e3 * h, gemms_bf16.flops(g) / h / 1e9);
  }
  std::printf("  %-22s %9s %10.1f %10.1f   (the steps' rest: f32 %.1f ms, bf16 %.1f ms)\n", "all",
              "", 1e3 * f32_total, 1e3 * bf16_total, 1e3 * (median(ours_f32.step) - f32_total),
              1e3 * (median(ours_bf16.step) - bf16_total));

  const double speedup = median(ours_f32.step) / median(ours_bf16.step);
  std::printf(
      "\ntessera bf16 step vs tessera f32 step  %5.2fx  (rounds %.2fx-%.2fx; target >= "
      "1.6x)  %s\n",
      speedup, *std::min_element(round_speedups.begin(), round_speedups.end()),
      *std::max_element(round_speedups.begin(), round_speedups.end()),
      speedup >= 1.6 ? "met" : "NOT met");
  for (const Column& c : theirs) {
    if (c.step.empty()) continue;
    std::printf("tessera bf16 step vs %-16s %5.2fx  (reported, not a target)\n", c.name.c_str(),
                median(c.step) / median(ours_bf16.step));
  }
  return 0;
}

}  // namespace tessera::bench
