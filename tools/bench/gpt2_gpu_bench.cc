// GPT-2 124M training step on one CUDA device (forward, backward, AdamW through ZeroOptimizer
// stage 0 with mixed precision) against PyTorch eager on the same GPU, run in the same
// invocation (tools/bench/gpt2_gpu_torch.py).
//
//   bazel build -c opt //tools/bench:gpt2_gpu_bench
//   bazel-bin/tools/bench/gpt2_gpu_bench [--dtype bf16] [--batch 16 --seq 1024] [--steps 10]
//
// Note [GPU step benchmark accounting]
// FLOPs per step as in Note [GPT-2 step benchmark accounting] (gpt2_step_bench.cc):
// tokens x (6N + 12 L H Q T), forward a third, backward two thirds. MFU divides by the
// device's dense bf16 tensor-core peak (cuda::dense_bf16_peak_flops: 989 TFLOP/s on an H100
// SXM at its rated clock) whatever --dtype, as the trainer does: PaLM's MFU uses the
// hardware peak. Memory: the caching allocator's peak_allocated
// over the timed steps, next to 16 bytes x N (DeepSpeed's mixed-precision model state:
// 16-bit parameter and gradient, f32 master and two Adam moments; f32 runs: parameter,
// gradient, two moments) plus the activations, measured as the allocator's bytes after
// forward + loss minus those before. An llm.c-style count of the saved tensors (flash
// attention: no (T, T) matrices) is printed beside the measurement as a cross-check.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "optim/optimizer.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tools/bench/gpt2_step_inputs.h"
#include "tools/bench/python_reference.h"
#include "tools/bench/stats.h"
#include "tools/bench/step_profile.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kTool = "gpt2_gpu_bench";
constexpr const char* kUsage =
    R"(usage: gpt2_gpu_bench [--dtype bf16|fp16|f32] [--batch B] [--seq T] [--steps N]
                      [--warmup N] [--device cuda:N] [--peak-tflops X]
                      [--torch-script FILE] [--python EXE] [--no-torch] [--no-torch-compile]

Times GPT-2 124M training steps on one CUDA device (ZeroOptimizer stage 0, AdamW, mixed
precision) and compares with PyTorch on the same device, eager and through torch.compile.

  --dtype D            bf16 (default), fp16 (dynamic loss scaling) or f32 (TF32 GEMMs)
  --batch B, --seq T   tokens per step B x T (default 16 x 1024)
  --steps N            timed steps (default 10)
  --warmup N           untimed steps first (default 3)
  --clip X             gradient_clipping (default 1.0, as GPT-2 configs; 0: none, the norm
                       still computed, as the trainer does), in both runs
  --device cuda:N      the device (default cuda:0)
  --peak-tflops X      the MFU denominator (default: the device's dense bf16 peak)
  --torch-script FILE  the PyTorch reference (default: tools/bench/gpt2_gpu_torch.py beside
                       this binary, in $BUILD_WORKSPACE_DIRECTORY, the runfiles, or ./)
  --python EXE         the interpreter with torch (default python3 on the PATH)
  --no-torch           skip the reference
  --no-torch-compile   skip the reference's torch.compile run
)";

using bench::median;

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// The profiled step's rows of at least 0.5% of it, per phase, and the rest summed
// (Note [Step profile]); `timed_ms` is the timed steps' median, for the events' overhead.
void print_profile(const std::vector<bench::ProfileRow>& rows, double timed_ms) {
  double total = 0;
  for (const bench::ProfileRow& r : rows) total += r.ms;
  std::printf(
      "\nwhere the device time goes: one more step, %.2f ms with a CUDA event around each "
      "module forward and backward node (the timed steps: %.2f ms); self time, rows of 0.5%% "
      "and more\n",
      total, timed_ms);
  std::printf("  %-9s %-72s %6s %9s %7s\n", "phase",
              "module (forward), or node in the module that recorded it (backward)", "calls", "ms",
              "share");
  double rest = 0;
  int64_t rest_rows = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const bench::ProfileRow& r = rows[i];
    if (r.ms >= 0.005 * total) {
      std::printf("  %-9s %-72s %6lld %9.3f %6.1f%%\n", r.phase.c_str(), r.label.c_str(),
                  static_cast<long long>(r.calls), r.ms, 100 * r.ms / total);
    } else {
      rest += r.ms;
      ++rest_rows;
    }
    if ((i + 1 == rows.size() || rows[i + 1].phase != r.phase) && rest_rows > 0) {
      std::printf("  %-9s %-72s %6s %9.3f %6.1f%%\n", r.phase.c_str(),
                  (std::to_string(rest_rows) + " smaller rows").c_str(), "", rest,
                  100 * rest / total);
      rest = 0;
      rest_rows = 0;
    }
  }
  std::fflush(stdout);
}

// "bf16", "fp16" (or "f16"), "f32" (or "fp32").
DType parse_precision(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "fp16" || s == "f16") return DType::f16;
  if (s == "f32" || s == "fp32") return DType::f32;
  throw cli::UsageError("--dtype expected bf16, fp16 or f32, found \"" + s + "\"");
}

// The reference's spelling of a dtype.
const char* torch_dtype(DType d) {
  return d == DType::bf16 ? "bf16" : d == DType::f16 ? "fp16" : "f32";
}

// The tensors a step keeps from forward to backward, counted the way llm.c's
// ActivationTensors are, with flash attention: per layer 18 BTC activations (ln_1, qkv,
// attention output, its projection, residual, ln_2, fc, gelu, fc projection, residual) in
// the training dtype, the LayerNorm statistics (4 BT) and attention's log-sum-exp (BHT) in
// f32; then the embedding sum, ln_f and the logits in the training dtype, ln_f's statistics
// and the cross-entropy log-sum-exp in f32.
double activation_estimate_bytes(const GptConfig& c, int64_t b, int64_t t, double elem) {
  const double bt = static_cast<double>(b * t), btc = bt * static_cast<double>(c.n_embd);
  const double bht = bt * static_cast<double>(c.n_head);
  const double per_layer = 18 * btc * elem + 4 * (4 * bt + bht);
  return static_cast<double>(c.n_layer) * per_layer + 2 * btc * elem + 4 * 3 * bt +
         bt * static_cast<double>(c.padded_vocab_size()) * elem;
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"dtype", Flag::kValue},
                          {"batch", Flag::kValue},
                          {"seq", Flag::kValue},
                          {"steps", Flag::kValue},
                          {"warmup", Flag::kValue},
                          {"device", Flag::kValue},
                          {"peak-tflops", Flag::kValue},
                          {"torch-script", Flag::kValue},
                          {"python", Flag::kValue},
                          {"no-torch", Flag::kSwitch},
                          {"no-torch-compile", Flag::kSwitch}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const DType dtype = parse_precision(flags.get("dtype", "bf16"));
  const int64_t steps = flags.get_int("steps", 10), warmup = flags.get_int("warmup", 3);
  const int64_t batch = flags.get_int("batch", 16), seq = flags.get_int("seq", 1024);
  const double clip = flags.get_double("clip", 1.0);
  if (!(clip >= 0)) throw cli::UsageError("--clip expected a number >= 0");
  double peak = flags.get_double("peak-tflops", 0.0) * 1e12;  // 0: the device's
  const GptConfig cfg = GptConfig::preset("gpt2");
  if (steps < 1 || warmup < 0 || batch < 1 || seq < 1 || seq > cfg.block_size ||
      !(peak > 0 || !flags.has("peak-tflops"))) {
    throw cli::UsageError(
        "expected --steps >= 1, --warmup >= 0, --batch >= 1, --seq in [1, 1024], "
        "--peak-tflops > 0");
  }
  Device device;
  try {
    device = Device::parse(flags.get("device", "cuda:0"));
  } catch (const Error& e) {
    throw cli::UsageError(std::string("--device: ") + e.what());
  }
  if (!device.is_cuda()) {
    throw cli::UsageError("--device expected cuda or cuda:N, found " + device.str());
  }
  cuda::check_device(device.index);  // NoDeviceError: run_tool exits with kExitNoDevice
  if (!flags.has("peak-tflops")) {
    const cuda::DeviceInfo info = cuda::device_info(device.index);
    peak = cuda::dense_bf16_peak_flops(info);
    if (!(peak > 0)) {
      throw cli::UsageError("no dense bf16 peak is known for " + info.name +
                            " (compute capability " + std::to_string(info.major) + "." +
                            std::to_string(info.minor) + "); expected --peak-tflops");
    }
  }
  const std::string script =
      bench::find_script(flags.get("torch-script"), argv[0], "gpt2_gpu_torch.py");
  const bool mixed = dtype != DType::f32;

  // Initialized in f32 on the CPU, then placed (as the trainer does); one rank.
  Gpt model(cfg, /*seed=*/1337);
  model.to(device, dtype);
  std::unique_ptr<parallel::Communicator> comm =
      std::move(parallel::make_thread_group(1)[0]);  // a group of one moves no data
  optim::OptimizerConfig oc;
  oc.lr = 1e-4;
  oc.weight_decay = 0.1;
  parallel::ZeroOptimizer zero(
      *comm, model, optim::decay_groups(model.named_parameters(), oc.lr, oc.weight_decay, true, {}),
      oc, parallel::ZeroConfig{}, parallel::MixedPrecision(dtype));
  // Random tokens and targets in [0, vocab_size), fixed seed (gpt2_step_bench's).
  const auto [idx, targets] = bench::random_step_tokens(cfg, batch, seq, device);

  const double n_params = static_cast<double>(cfg.num_parameters());
  const double tokens = static_cast<double>(batch * seq);
  const double attn = 12.0 * static_cast<double>(cfg.n_layer * cfg.n_head * cfg.head_dim() * seq);
  const double flops_step = tokens * (6 * n_params + attn);
  std::printf(
      "GPT-2 124M training step on %s: %.0f parameters, B=%lld T=%lld (%.0f tokens), %s, "
      "AdamW, ZeroOptimizer stage 0; %lld warm-up + %lld timed steps\n",
      device.str().c_str(), n_params, static_cast<long long>(batch), static_cast<long long>(seq),
      tokens, mixed ? (std::string(dtype_name(dtype)) + " with f32 master weights").c_str() : "f32",
      static_cast<long long>(warmup), static_cast<long long>(steps));
  std::printf("FLOPs per step: %.1f GFLOP (PaLM: tokens x (6N + 12 L H Q T))\n", flops_step / 1e9);
  std::printf("MFU peak: %.1f TFLOP/s%s\n", peak / 1e12,
              flags.has("peak-tflops") ? " (--peak-tflops)" : " (the device's dense bf16 peak)");
  std::fflush(stdout);

  Allocator& gpu = allocator_for(device);
  const int dev = device.index;
  struct StepResult {
    double step, forward, backward, optimizer;
    Tensor loss;
    double activations;  // allocator bytes
    bool stepped;
  };
  auto d = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  // A step's phases, for the timed steps and the profiled one.
  const auto forward = [&] { return model.loss(model.forward(idx), targets); };
  const auto backward = [&](const Tensor& loss) { zero.backward(loss, 1.0, /*boundary=*/true); };
  const auto optimizer = [&] {
    // As the trainer's engine: the norm, clip factor, unscale (fp16) and overflow check on
    // the device, folded into AdamW's one pass (Note [One-pass mixed-precision step]).
    zero.prepare_step(clip);
    return zero.step();
  };
  // One step, the device synchronized at its start and after each phase.
  auto run_step = [&] {
    cuda::synchronize(dev);
    const auto t0 = Clock::now();
    zero.zero_grad();
    const double before = static_cast<double>(gpu.stats().allocated);
    const Tensor loss = forward();
    cuda::synchronize(dev);
    const auto t1 = Clock::now();
    const double after = static_cast<double>(gpu.stats().allocated);
    backward(loss);
    cuda::synchronize(dev);
    const auto t2 = Clock::now();
    const bool stepped = optimizer();
    cuda::synchronize(dev);
    const auto t3 = Clock::now();
    return StepResult{d(t0, t3), d(t0, t1), d(t1, t2), d(t2, t3), loss, after - before, stepped};
  };
  std::vector<double> step_s, fwd_s, bwd_s, opt_s;
  double first_loss = 0, last_loss = 0, activations = 0;
  int64_t skipped = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    if (s == warmup) gpu.reset_peak();
    const StepResult r = run_step();
    last_loss = r.loss.item<double>();  // after the clocks: a device-to-host copy
    if (s == 0) first_loss = last_loss;
    if (s < warmup) continue;
    step_s.push_back(r.step);
    fwd_s.push_back(r.forward);
    bwd_s.push_back(r.backward);
    opt_s.push_back(r.optimizer);
    activations = r.activations;
    skipped += r.stepped ? 0 : 1;
  }
  const AllocatorStats mem = gpu.stats();
  const double step_med = median(step_s), tok_s = tokens / step_med;
  const double f = median(fwd_s), b = median(bwd_s), o = median(opt_s);
  std::printf(
      "losses: first step %.4f, last step %.4f (ln 50257 = 10.825)%s\n", first_loss, last_loss,
      skipped ? (", " + std::to_string(skipped) + " timed steps skipped (fp16 overflow)").c_str()
              : "");
  std::printf("\ntimed steps (ms): total = forward + loss | backward | optimizer (AdamW)\n");
  for (size_t i = 0; i < step_s.size(); ++i) {
    std::printf("  step %2zu: %8.2f = %8.2f | %8.2f | %8.2f\n", i + 1, 1e3 * step_s[i],
                1e3 * fwd_s[i], 1e3 * bwd_s[i], 1e3 * opt_s[i]);
  }
  // Before the references, which may be cut off by a time limit.
  std::printf("\ntessera: step %.2f ms, %.0f tokens/s, MFU %.1f%%\n", 1e3 * step_med, tok_s,
              100 * flops_step / step_med / peak);
  std::printf("\ntessera time breakdown (median ms; TFLOP/s; share of the step)\n");
  std::printf("  forward + loss   %8.2f ms  %7.1f TFLOP/s  %5.1f%%\n", 1e3 * f,
              flops_step / 3 / f / 1e12, 100 * f / step_med);
  std::printf("  backward         %8.2f ms  %7.1f TFLOP/s  %5.1f%%\n", 1e3 * b,
              2 * flops_step / 3 / b / 1e12, 100 * b / step_med);
  std::printf("  optimizer        %8.2f ms  %7.1f GB/s     %5.1f%%\n", 1e3 * o,
              (mixed ? 34.0 : 32.0) * n_params / o / 1e9, 100 * o / step_med);
  std::printf(
      "  (optimizer traffic: the norm reads g, then one pass reads p, g, m, v and writes p, m, "
      "v%s: %s bytes per parameter)\n",
      mixed ? " and the 16-bit model" : "", mixed ? "4 + 30 = 34" : "4 + 28 = 32");

  // Memory (Note [GPU step benchmark accounting]).
  const double elem = static_cast<double>(itemsize(dtype));
  const double state_formula = 16 * n_params;
  const parallel::ModelStateBytes own = zero.model_state_bytes();
  const double estimate = state_formula + activations;
  std::printf("\ntessera GPU memory (caching allocator of %s)\n", device.str().c_str());
  std::printf("  model state, 16 B x N                %9.1f MiB\n", mib(state_formula));
  std::printf(
      "  ZeroOptimizer's buffers              %9.1f MiB (params %.1f, grads %.1f, "
      "optimizer %.1f; %.1f B/param)\n",
      mib(static_cast<double>(own.total())), mib(static_cast<double>(own.params)),
      mib(static_cast<double>(own.grads)), mib(static_cast<double>(own.optimizer)),
      static_cast<double>(own.total()) / n_params);
  std::printf("  activations (measured)               %9.1f MiB (llm.c-style count: %.1f MiB)\n",
              mib(activations), mib(activation_estimate_bytes(cfg, batch, seq, elem)));
  std::printf("  estimate 16 B x N + activations      %9.1f MiB\n", mib(estimate));
  std::printf("  peak allocated in the timed steps    %9.1f MiB (%.3f x the estimate)\n",
              mib(static_cast<double>(mem.peak_allocated)),
              static_cast<double>(mem.peak_allocated) / estimate);
  std::printf("  reserved (with the cache)            %9.1f MiB\n",
              mib(static_cast<double>(mem.reserved)));
  std::fflush(stdout);

  // One more step, its device time split by module forward and backward node.
  {
    std::unique_ptr<bench::MarkClock> clock = bench::device_clock(dev);
    bench::StepProfile profile(*clock, model);
    cuda::synchronize(dev);
    zero.zero_grad();
    Tensor loss;
    profile.phase("forward", [&] { loss = forward(); });
    profile.phase("backward", [&] { backward(loss); });
    profile.phase("optimizer", [&] { optimizer(); });
    print_profile(profile.rows(), 1e3 * step_med);
  }

  // The PyTorch reference, eager or through torch.compile; none when unavailable.
  const auto run_torch = [&](bool compiled) -> std::optional<nlohmann::json> {
    std::printf("\nrunning the PyTorch reference%s: %s\n", compiled ? " (torch.compile)" : "",
                script.c_str());
    std::fflush(stdout);
    const bench::ScriptResult r = bench::run_script(
        flags.get("python", "python3"), script,
        "--batch " + std::to_string(batch) + " --seq " + std::to_string(seq) + " --steps " +
            std::to_string(steps) + " --warmup " + std::to_string(warmup) + " --dtype " +
            torch_dtype(dtype) + " --device " + device.str() + " --clip " + std::to_string(clip) +
            (compiled ? " --compile" : ""),
        "tokens_per_s");
    if (!r.json) {
      std::printf("PyTorch reference%s unavailable: %s\n", compiled ? " (torch.compile)" : "",
                  r.why.c_str());
      return std::nullopt;
    }
    std::printf("PyTorch %s on %s\n", r.json->value("torch", std::string("?")).c_str(),
                r.json->value("device_name", std::string("?")).c_str());
    return r.json;
  };
  std::optional<nlohmann::json> ref, compiled;
  if (!flags.has("no-torch")) {
    ref = run_torch(false);
    if (ref && !flags.has("no-torch-compile")) compiled = run_torch(true);
  }

  const double torch_step = bench::json_number(ref, "step_ms") / 1e3;
  const double torch_tok_s = bench::json_number(ref, "tokens_per_s");
  std::printf("\n%-30s %14s", "", "tessera");
  if (ref) std::printf(" %14s", "pytorch");
  std::printf("\n");
  auto row = [&](const char* name, double ours, double theirs, const char* fmt) {
    std::printf("%-30s ", name);
    std::printf(fmt, ours);
    if (ref) {
      std::printf(" ");
      std::printf(fmt, theirs);
    }
    std::printf("\n");
  };
  row("step ms (median)", 1e3 * step_med, 1e3 * torch_step, "%14.2f");
  row("  forward + loss ms", 1e3 * f, bench::json_number(ref, "forward_ms"), "%14.2f");
  row("  backward ms", 1e3 * b, bench::json_number(ref, "backward_ms"), "%14.2f");
  row("  optimizer ms", 1e3 * o, bench::json_number(ref, "optimizer_ms"), "%14.2f");
  row("tokens/s", tok_s, torch_tok_s, "%14.0f");
  row("MFU %", 100 * flops_step / step_med / peak, 100 * flops_step / torch_step / peak, "%14.1f");
  row("peak allocated MiB", mib(static_cast<double>(mem.peak_allocated)),
      mib(bench::json_number(ref, "peak_mem_bytes")), "%14.1f");
  row("reserved MiB", mib(static_cast<double>(mem.reserved)),
      mib(bench::json_number(ref, "peak_reserved_bytes")), "%14.1f");
  // Different random tokens and init: the losses only show that both train.
  row("last loss (own tokens)", last_loss, bench::json_number(ref, "loss"), "%14.4f");

  std::printf("\nsummary\n");
  std::printf("  tokens/s %.0f, step %.2f ms, MFU %.1f%% of %.1f TFLOP/s\n", tok_s, 1e3 * step_med,
              100 * flops_step / step_med / peak, peak / 1e12);
  if (ref) {
    std::printf("  tokens/s ours / PyTorch          %6.3fx\n", tok_s / torch_tok_s);
    std::printf(
        "  peak allocated ours / PyTorch    %6.3fx\n",
        static_cast<double>(mem.peak_allocated) / bench::json_number(ref, "peak_mem_bytes"));
  } else {
    std::printf("  tokens/s ours / PyTorch          reference unavailable\n");
  }
  if (compiled) {
    const double compiled_step = bench::json_number(compiled, "step_ms") / 1e3;
    std::printf("  torch.compile: step %.2f ms, MFU %.1f%%, peak allocated %.1f MiB\n",
                1e3 * compiled_step, 100 * flops_step / compiled_step / peak,
                mib(bench::json_number(compiled, "peak_mem_bytes")));
    std::printf("  tokens/s ours / torch.compile    %6.3fx\n",
                tok_s / bench::json_number(compiled, "tokens_per_s"));
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool(tessera::kTool, tessera::kUsage, tessera::bench_main, argc, argv);
}
