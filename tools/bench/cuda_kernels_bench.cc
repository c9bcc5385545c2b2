// CUDA kernel table for one device: kernels::matmul at the GEMM shapes of a GPT-2 124M
// training step (bf16 and f32/TF32) against the H100 SXM dense peaks, causal attention
// against PyTorch's scaled_dot_product_attention at the same shapes (attention_torch.py, run
// in the same invocation), and the bandwidth of the memory-bound kernels against
// cudaMemcpy's device-to-device copy measured in the same run.
//
//   bazel build -c opt //tools/bench:cuda_kernels_bench
//   bazel-bin/tools/bench/cuda_kernels_bench [--batch 16 --seq 1024] [--dtype bf16] [--reps 30]
//
// Note [CUDA kernel table accounting]
// A GEMM does 2 M N K FLOPs; the peaks are the H100 SXM's dense tensor-core rates, 989
// TFLOP/s bf16 and 494.7 TFLOP/s TF32. A memory-bound kernel's bytes are those of the
// tensors it reads and writes (each once; its own scratch is not counted) and its rate is
// compared with cudaMemcpy of a large buffer from device to device (bytes read + written),
// the rate a kernel that only streams memory can hope for. Causal attention does
// 2 B H T^2 D FLOPs forward (half of q k^T and p v) and 2.5 times that backward (five
// products: the recomputed scores, dV, dP, dQ, dK). Its rows are the routed call (cuDNN's
// fused attention where it takes it, kernels/fused_attention.h) and Tessera's own flash
// kernels on the same operands. The step's tensors are the real
// sizes: those under the 50 MB L2 (LayerNorm's (B T, C) in 16 bits is 25 MB) may partly stay
// cached across repetitions and beat the copy. Every time is the median over 3 rounds of
// --reps back-to-back calls, the device synchronized before and after each round, after
// --warmup untimed calls.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/philox.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/kernels.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/softmax.h"
#include "models/gpt2/config.h"
#include "tools/bench/python_reference.h"
#include "tools/bench/step_gemms.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

constexpr const char* kTool = "cuda_kernels_bench";
constexpr const char* kUsage =
    R"(usage: cuda_kernels_bench [--device cuda:N] [--batch B] [--seq T] [--dtype bf16|fp16|f32]
                          [--reps N] [--warmup N] [--copy-mib M]
                          [--torch-script FILE] [--python EXE] [--no-torch]

Times CUDA kernels at GPT-2 124M training-step sizes: matmul against the H100 SXM peaks,
causal attention against PyTorch's scaled_dot_product_attention, memory-bound kernels
against the device-to-device copy bandwidth of the same run.

  --device cuda:N   the device (default cuda:0)
  --batch B         sequences per step (default 16)
  --seq T           tokens per sequence (default 1024); the kernels see B x T rows
  --dtype D         dtype of the memory-bound kernels: bf16 (default), fp16 or f32
  --reps N          timed calls per round, at least 20 (default 30)
  --warmup N        untimed calls first (default 3)
  --copy-mib M      MiB of the copy reference's buffer (default 1024)
  --torch-script F  the attention reference (default: tools/bench/attention_torch.py beside
                    the binary or in the workspace)
  --python EXE      the interpreter with torch (default python3 on the PATH)
  --no-torch        skip the reference
)";

constexpr double kPeakBf16 = 989.0e12;  // H100 SXM dense bf16 tensor cores
constexpr double kPeakTf32 = 494.7e12;  // H100 SXM dense TF32 tensor cores

// Seconds per call of `fn`: median over 3 rounds of `reps` calls (Note [CUDA kernel table
// accounting]).
double time_op(int dev, int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> rounds;
  for (int r = 0; r < 3; ++r) {
    cuda::synchronize(dev);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    cuda::synchronize(dev);
    rounds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                     reps);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[1];
}

// N(0, 1) values on the device. Large tensors repeat one random block of about 16M
// elements along dim 0 (host-side generation of a billion values would take minutes; the
// kernels' speed does not depend on the values being distinct).
Tensor random_on(const Shape& shape, DType dtype, Device device, Generator& gen) {
  constexpr int64_t kBlock = int64_t{1} << 24;
  const int64_t n = numel_of(shape);
  if (n <= kBlock) return randn(shape, gen, {dtype, device});
  const int64_t row = n / shape[0];
  const int64_t block_rows = std::max<int64_t>(1, kBlock / row);
  Shape block_shape = shape;
  block_shape[0] = block_rows;
  const Tensor block = randn(block_shape, gen, {dtype, device});
  const Tensor out = empty(shape, {dtype, device});
  for (int64_t r = 0; r < shape[0]; r += block_rows) {
    const int64_t len = std::min(block_rows, shape[0] - r);
    out.narrow(0, r, len).copy_(block.narrow(0, 0, len));
  }
  return out;
}

// One GEMM of the step (the shapes and layouts of StepGemms, Note [GEMM share of the step]).
struct Gemm {
  int group;  // index into StepGemms::kNames
  std::string what;
  int64_t count;  // calls per step
  Shape a, b;
  bool ta, tb;
  int64_t m() const { return ta ? a[1] : a[0]; }
  int64_t k() const { return ta ? a[0] : a[1]; }
  int64_t n() const { return tb ? b[0] : b[1]; }
  double flops() const { return 2.0 * static_cast<double>(m()) * n() * k(); }
};

std::vector<Gemm> step_gemms(const GptConfig& c, int64_t rows) {
  const int64_t C = c.n_embd, L = c.n_layer, V = c.padded_vocab_size(), R = rows;
  struct Layer {
    const char* name;
    int64_t out, in;
  };
  std::vector<Gemm> g;
  for (const Layer& l : {Layer{"c_attn", 3 * C, C}, Layer{"attn.c_proj", C, C},
                         Layer{"c_fc", 4 * C, C}, Layer{"mlp.c_proj", C, 4 * C}}) {
    const std::string n = l.name;
    g.push_back({0, n + " y = x W^T", L, {R, l.in}, {l.out, l.in}, false, true});
    g.push_back({2, n + " dx = g W", L, {R, l.out}, {l.out, l.in}, false, false});
    g.push_back({3, n + " dW = g^T x", L, {R, l.out}, {R, l.in}, true, false});
  }
  g.push_back({1, "head logits = h wte^T", 1, {R, C}, {V, C}, false, true});
  g.push_back({4, "head dh = g wte", 1, {R, V}, {V, C}, false, false});
  g.push_back({4, "head dwte^T = h^T g", 1, {R, C}, {R, V}, true, false});
  std::stable_sort(g.begin(), g.end(),
                   [](const Gemm& x, const Gemm& y) { return x.group < y.group; });
  return g;
}

std::string shape_text(const Shape& s, bool transposed) {
  std::string t = "(" + std::to_string(s[0]) + "x" + std::to_string(s[1]) + ")";
  return transposed ? t + "^T" : t;
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"device", Flag::kValue},
                          {"batch", Flag::kValue},
                          {"seq", Flag::kValue},
                          {"dtype", Flag::kValue},
                          {"reps", Flag::kValue},
                          {"warmup", Flag::kValue},
                          {"copy-mib", Flag::kValue},
                          {"torch-script", Flag::kValue},
                          {"python", Flag::kValue},
                          {"no-torch", Flag::kSwitch}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const int64_t batch = flags.get_int("batch", 16), seq = flags.get_int("seq", 1024);
  const int64_t reps = flags.get_int("reps", 30), warmup = flags.get_int("warmup", 3);
  const int64_t copy_mib = flags.get_int("copy-mib", 1024);
  if (batch < 1 || seq < 1 || reps < 20 || warmup < 0 || copy_mib < 1) {
    throw cli::UsageError(
        "expected --batch >= 1, --seq >= 1, --reps >= 20, --warmup >= 0, --copy-mib >= 1");
  }
  const std::string dtype_flag = flags.get("dtype", "bf16");
  const DType dtype = dtype_flag == "bf16"                          ? DType::bf16
                      : dtype_flag == "fp16" || dtype_flag == "f16" ? DType::f16
                      : dtype_flag == "f32" || dtype_flag == "fp32" ? DType::f32
                                                                    : DType::f64;
  if (dtype == DType::f64) {
    throw cli::UsageError("--dtype expected bf16, fp16 or f32, found \"" + dtype_flag + "\"");
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
  const int dev = device.index;
  const int w = static_cast<int>(warmup), n = static_cast<int>(reps);
  const GptConfig cfg = GptConfig::preset("gpt2");
  const int64_t rows = batch * seq, C = cfg.n_embd, V = cfg.vocab_size;
  const int64_t Vp = cfg.padded_vocab_size();
  Generator gen(7);
  std::printf(
      "CUDA kernels on %s at GPT-2 124M step sizes: B x T = %lld rows, C = %lld, V = %lld "
      "(padded %lld); median of 3 rounds of %lld calls after %lld warm-up calls\n",
      device.str().c_str(), static_cast<long long>(rows), static_cast<long long>(C),
      static_cast<long long>(V), static_cast<long long>(Vp), static_cast<long long>(reps),
      static_cast<long long>(warmup));

  // ---- GEMMs ------------------------------------------------------------------------------
  const std::vector<Gemm> gemms = step_gemms(cfg, rows);
  struct Rate {
    double seconds = 0;  // per call; 0 when the call failed
    std::string error;
  };
  std::vector<std::array<Rate, 2>> rates(gemms.size());  // [bf16, f32]
  const std::array<DType, 2> gemm_dtypes{DType::bf16, DType::f32};
  for (int di = 0; di < 2; ++di) {
    std::map<std::pair<Shape, DType>, Tensor> operands;  // the step reuses its activations
    auto operand = [&](const Shape& s) -> const Tensor& {
      Tensor& t = operands[{s, gemm_dtypes[di]}];
      if (!t.defined()) t = random_on(s, gemm_dtypes[di], device, gen);
      return t;
    };
    for (size_t i = 0; i < gemms.size(); ++i) {
      const Gemm& g = gemms[i];
      try {
        const Tensor a = operand(g.a), b = operand(g.b);
        rates[i][di].seconds = time_op(dev, w, n, [&] { kernels::matmul(a, b, g.ta, g.tb); });
      } catch (const std::exception& e) {
        rates[i][di].error = e.what();
      }
    }
  }
  std::printf(
      "\nGEMMs of one step (kernels::matmul; TF32 for f32): TFLOP/s and share of the peak "
      "(bf16 %.1f, TF32 %.1f TFLOP/s, H100 SXM dense)\n",
      kPeakBf16 / 1e12, kPeakTf32 / 1e12);
  std::printf("  %-26s %-28s %6s %6s %6s %5s | %9s %6s | %9s %6s\n", "", "a x b", "M", "N", "K",
              "calls", "bf16", "%peak", "TF32", "%peak");
  std::array<double, 2> step_time{}, step_flops{};
  int group = -1;
  for (size_t i = 0; i < gemms.size(); ++i) {
    const Gemm& g = gemms[i];
    if (g.group != group) std::printf("  %s\n", bench::StepGemms::kNames[group = g.group]);
    std::printf("  %-26s %-28s %6lld %6lld %6lld %5lld |", g.what.c_str(),
                (shape_text(g.a, g.ta) + " " + shape_text(g.b, g.tb)).c_str(),
                static_cast<long long>(g.m()), static_cast<long long>(g.n()),
                static_cast<long long>(g.k()), static_cast<long long>(g.count));
    for (int di = 0; di < 2; ++di) {
      const Rate& r = rates[i][di];
      const double peak = di == 0 ? kPeakBf16 : kPeakTf32;
      if (r.seconds > 0) {
        const double tflops = g.flops() / r.seconds / 1e12;
        std::printf(" %9.1f %5.1f%%", tflops, 100 * tflops * 1e12 / peak);
        step_time[di] += r.seconds * static_cast<double>(g.count);
        step_flops[di] += g.flops() * static_cast<double>(g.count);
      } else {
        std::printf(" %9s %6s", "error", "");
      }
      if (di == 0) std::printf(" |");
    }
    std::printf("\n");
  }
  for (size_t i = 0; i < gemms.size(); ++i) {
    for (int di = 0; di < 2; ++di) {
      if (!rates[i][di].error.empty()) {
        std::printf("  error: %s %s: %s\n", gemms[i].what.c_str(),
                    dtype_name(gemm_dtypes[di]).data(), rates[i][di].error.c_str());
      }
    }
  }
  for (int di = 0; di < 2; ++di) {
    if (step_time[di] <= 0) continue;
    const double rate = step_flops[di] / step_time[di];
    std::printf("  one step's GEMMs in %s: %.1f GFLOP in %.2f ms = %.1f TFLOP/s (%.1f%% of peak)\n",
                di == 0 ? "bf16" : "TF32", step_flops[di] / 1e9, 1e3 * step_time[di], rate / 1e12,
                100 * rate / (di == 0 ? kPeakBf16 : kPeakTf32));
  }
  std::fflush(stdout);

  // ---- causal attention --------------------------------------------------------------------
  {
    const int64_t H = cfg.n_head, D = C / H;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const double fwd_flops = 2.0 * static_cast<double>(batch * H * seq) * seq * D;
    const double bwd_flops = 2.5 * fwd_flops;
    double fwd_s = 0, bwd_s = 0, flash_fwd_s = 0, flash_bwd_s = 0, drop_fwd_s = 0, drop_bwd_s = 0;
    std::string error;
    try {
      const Shape shape{batch, H, seq, D};
      const Tensor q = random_on(shape, dtype, device, gen),
                   k = random_on(shape, dtype, device, gen);
      const Tensor v = random_on(shape, dtype, device, gen);
      const Tensor dout = random_on(shape, dtype, device, gen);
      const kernels::AttentionOutput o = kernels::causal_attention(q, k, v, scale);
      fwd_s = time_op(dev, w, n, [&] { kernels::causal_attention(q, k, v, scale); });
      bwd_s = time_op(dev, w, n, [&] {
        kernels::causal_attention_backward(dout, q, k, v, o.out, o.lse, scale);
      });
      // Tessera's own kernels, which run where cuDNN's fused attention does not.
      flash_fwd_s =
          time_op(dev, w, n, [&] { kernels::cuda::flash_causal_attention(q, k, v, scale); });
      flash_bwd_s = time_op(dev, w, n, [&] {
        kernels::cuda::flash_causal_attention_backward(dout, q, k, v, o.out, o.lse, scale);
      });
      // With dropout at p = 0.1 on the probabilities, as attention_torch.py's --dropout.
      const kernels::AttentionDropout drop{0.1, 5, 0};
      const kernels::AttentionOutput od = kernels::causal_attention(q, k, v, scale, drop);
      drop_fwd_s = time_op(dev, w, n, [&] { kernels::causal_attention(q, k, v, scale, drop); });
      drop_bwd_s = time_op(dev, w, n, [&] {
        kernels::causal_attention_backward(dout, q, k, v, od.out, od.lse, scale, drop);
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::optional<nlohmann::json> ref;
    std::string why = "skipped (--no-torch)";
    if (!flags.has("no-torch")) {
      const std::string script =
          bench::find_script(flags.get("torch-script"), argv[0], "attention_torch.py");
      const bench::ScriptResult r = bench::run_script(
          flags.get("python", "python3"), script,
          "--batch " + std::to_string(batch) + " --heads " + std::to_string(H) + " --seq " +
              std::to_string(seq) + " --head-dim " + std::to_string(D) + " --dtype " +
              (dtype == DType::f16 ? "fp16" : std::string(dtype_name(dtype))) + " --reps " +
              std::to_string(n) + " --warmup " + std::to_string(w) + " --device " + device.str(),
          "attention_forward_ms");
      ref = r.json;
      why = r.why;
    }
    std::printf(
        "\ncausal attention (B, H, T, D) = (%lld, %lld, %lld, %lld) in %s: against PyTorch's "
        "scaled_dot_product_attention(is_causal=True)%s\n",
        static_cast<long long>(batch), static_cast<long long>(H), static_cast<long long>(seq),
        static_cast<long long>(D), dtype_name(dtype).data(),
        ref ? (" " + ref->value("torch", std::string("?"))).c_str() : "");
    std::printf("  %-10s %10s %9s | %10s %9s | %13s\n", "", "ms", "TFLOP/s", "pytorch ms",
                "TFLOP/s", "pytorch/ours");
    auto attention_row = [&](const char* name, double s, double flops, const char* key) {
      const double theirs = bench::json_number(ref, key) / 1e3;
      std::printf("  %-10s %10.3f %9.1f | %10.3f %9.1f | %12.2fx\n", name, 1e3 * s,
                  flops / s / 1e12, 1e3 * theirs, flops / theirs / 1e12, theirs / s);
    };
    if (error.empty()) {
      attention_row("forward", fwd_s, fwd_flops, "attention_forward_ms");
      attention_row("backward", bwd_s, bwd_flops, "attention_backward_ms");
      attention_row("flash fwd", flash_fwd_s, fwd_flops, "attention_forward_ms");
      attention_row("flash bwd", flash_bwd_s, bwd_flops, "attention_backward_ms");
      attention_row("fwd p 0.1", drop_fwd_s, fwd_flops, "attention_dropout_forward_ms");
      attention_row("bwd p 0.1", drop_bwd_s, bwd_flops, "attention_dropout_backward_ms");
    } else {
      std::printf("  error: %s\n", error.c_str());
    }
    if (!ref) std::printf("  PyTorch reference unavailable: %s\n", why.c_str());
    std::fflush(stdout);
  }

  // ---- memory-bound kernels -----------------------------------------------------------------
  const int64_t copy_elems = copy_mib * (int64_t{1} << 20) / 4;
  const double copy_bytes = 2.0 * 4.0 * static_cast<double>(copy_elems);  // read + written
  double copy_s = 0;
  {
    const Tensor src = zeros({copy_elems}, {DType::f32, device});
    const Tensor dst = empty({copy_elems}, {DType::f32, device});
    copy_s = time_op(dev, w, n, [&] {
      cuda::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes(), cuda::CopyKind::device_to_device,
                   dev);
    });
  }
  const double copy_bw = copy_bytes / copy_s;
  std::printf(
      "\nmemory-bound kernels (%s): GB/s = (bytes read + written) / time, against the "
      "copy\n",
      dtype_name(dtype).data());
  std::printf("  %-44s %9s %9s %9s %7s\n", "", "MB", "ms", "GB/s", "/copy");
  auto report = [&](const char* name, double bytes, double s) {
    std::printf("  %-44s %9.1f %9.3f %9.1f %6.1f%%\n", name, bytes / 1e6, 1e3 * s, bytes / s / 1e9,
                100 * bytes / s / copy_bw);
  };
  report(("cudaMemcpy device to device, " + std::to_string(copy_mib) + " MiB").c_str(), copy_bytes,
         copy_s);
  auto bytes_of = [](std::initializer_list<Tensor> ts) {
    double b = 0;
    for (const Tensor& t : ts) {
      if (t.defined()) b += static_cast<double>(t.nbytes());
    }
    return b;
  };
  // Each row builds its inputs, runs once for the outputs' sizes, then is timed.
  auto row = [&](const char* name, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      std::printf("  %-44s error: %s\n", name, e.what());
    }
    std::fflush(stdout);
  };
  row("Tensor::copy_ transpose (B T, C) -> (C, B T)", [&] {
    const Tensor x = random_on({rows, C}, dtype, device, gen);
    const Tensor y = empty({C, rows}, {dtype, device});
    const Tensor xt = x.transpose(0, 1);
    const double s = time_op(dev, w, n, [&] { y.copy_(xt); });
    report("Tensor::copy_ transpose (B T, C) -> (C, B T)", bytes_of({x, y}), s);
  });
  row("Tensor::copy_ f32 -> dtype (B T, C)", [&] {
    const Tensor x = random_on({rows, C}, DType::f32, device, gen);
    const Tensor y = empty({rows, C}, {dtype, device});
    const double s = time_op(dev, w, n, [&] { y.copy_(x); });
    report("Tensor::copy_ f32 -> dtype (B T, C)", bytes_of({x, y}), s);
  });
  row("layer_norm forward (B T, C)", [&] {
    const Tensor x = random_on({rows, C}, dtype, device, gen);
    const Tensor wt = random_on({C}, dtype, device, gen), bs = random_on({C}, dtype, device, gen);
    const kernels::LayerNormOutput o = kernels::layer_norm(x, wt, bs, 1e-5);
    const double s = time_op(dev, w, n, [&] { kernels::layer_norm(x, wt, bs, 1e-5); });
    report("layer_norm forward (B T, C)", bytes_of({x, wt, bs, o.y, o.mean, o.rstd}), s);
  });
  row("layer_norm backward (B T, C)", [&] {
    const Tensor x = random_on({rows, C}, dtype, device, gen);
    const Tensor dy = random_on({rows, C}, dtype, device, gen);
    const Tensor wt = random_on({C}, dtype, device, gen), bs = random_on({C}, dtype, device, gen);
    const kernels::LayerNormOutput o = kernels::layer_norm(x, wt, bs, 1e-5);
    const kernels::LayerNormGrads g = kernels::layer_norm_backward(dy, x, wt, o.mean, o.rstd);
    const double s =
        time_op(dev, w, n, [&] { kernels::layer_norm_backward(dy, x, wt, o.mean, o.rstd); });
    report("layer_norm backward (B T, C)",
           bytes_of({dy, x, wt, o.mean, o.rstd, g.dx, g.dweight, g.dbias}), s);
  });
  row("softmax forward (B T, Vp)", [&] {
    const Tensor x = random_on({rows, Vp}, dtype, device, gen);
    const Tensor y = kernels::softmax(x);
    const double s = time_op(dev, w, n, [&] { kernels::softmax(x); });
    report("softmax forward (B T, Vp)", bytes_of({x, y}), s);
  });
  row("softmax forward (B H T, T)", [&] {
    const Tensor x = random_on({batch * cfg.n_head * seq, seq}, dtype, device, gen);
    const Tensor y = kernels::softmax(x);
    const double s = time_op(dev, w, n, [&] { kernels::softmax(x); });
    report("softmax forward (B H T, T)", bytes_of({x, y}), s);
  });
  // The model's loss reads the first V columns of the padded logits (a strided view).
  std::vector<int32_t> target_ids(static_cast<size_t>(rows));
  for (size_t i = 0; i < target_ids.size(); ++i) {
    target_ids[i] = static_cast<int32_t>(philox4x32(i, 0, 1234)[0] % static_cast<uint32_t>(V));
  }
  const Tensor targets = from_vector(target_ids, {rows}).to(device);
  row("cross_entropy forward (B T, V of Vp)", [&] {
    const Tensor logits = random_on({rows, Vp}, dtype, device, gen).narrow(1, 0, V);
    const kernels::CrossEntropyOutput o = kernels::cross_entropy(logits, targets);
    const double s = time_op(dev, w, n, [&] { kernels::cross_entropy(logits, targets); });
    report("cross_entropy forward (B T, V of Vp)", bytes_of({logits, targets, o.loss, o.lse}), s);
  });
  row("cross_entropy backward (B T, V of Vp)", [&] {
    const Tensor logits = random_on({rows, Vp}, dtype, device, gen).narrow(1, 0, V);
    const kernels::CrossEntropyOutput o = kernels::cross_entropy(logits, targets);
    const Tensor dloss = ones({}, {o.loss.dtype(), device});
    const Tensor dx = kernels::cross_entropy_backward(dloss, logits, targets, o.lse);
    const double s =
        time_op(dev, w, n, [&] { kernels::cross_entropy_backward(dloss, logits, targets, o.lse); });
    report("cross_entropy backward (B T, V of Vp)", bytes_of({logits, targets, o.lse, dloss, dx}),
           s);
  });
  row("AdamW step (N, f32)", [&] {
    // The f32 master weights' step of a mixed-precision run: one flat buffer of N.
    const int64_t np = cfg.num_parameters();
    const TensorOptions f32{DType::f32, device};
    const Tensor p = random_on({np}, DType::f32, device, gen);
    const Tensor g = random_on({np}, DType::f32, device, gen);
    const Tensor m = zeros({np}, f32), v = zeros({np}, f32);
    kernels::AdamWParams ap;
    ap.lr = 1e-4;
    ap.weight_decay = 0.1;
    const double s = time_op(dev, w, n, [&] { kernels::adamw_step(p, g, m, v, ap); });
    // Reads p, g, m, v; writes p, m, v.
    report("AdamW step (N, f32)", bytes_of({p, g, m, v}) + bytes_of({p, m, v}), s);
  });
  std::printf("\ncopy bandwidth (cudaMemcpy device to device, read + written): %.1f GB/s\n",
              copy_bw / 1e9);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool(tessera::kTool, tessera::kUsage, tessera::bench_main, argc, argv);
}
