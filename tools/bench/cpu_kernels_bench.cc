// CPU kernel benchmark: matmul GFLOP/s against raw Eigen GEMM, causal attention against
// the same attention materialized through matmul and softmax, and the bandwidth of the
// memory-bound kernels against a plain memcpy of the same bytes, all measured in one run
// so that a noisy machine still gives stable ratios.
//
//   bazel run //tools/bench:cpu_kernels_bench [-- --reps N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/softmax.h"
#include "tools/bench/eigen_reference.h"

namespace tessera {
namespace {

// Median wall times of `reps` runs each of `a` and `b`, after one warm-up each. The runs
// alternate, so drift in the machine's speed (shared, throttled VMs) hits both alike.
std::pair<double, double> time_pair(int reps, const std::function<void()>& a,
                                    const std::function<void()>& b) {
  auto once = [](const std::function<void()>& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  once(a);
  once(b);
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    ta.push_back(once(a));
    tb.push_back(once(b));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

void bench_matmul(int reps) {
  struct Gemm {
    int64_t m, k, n;
  };
  const std::vector<Gemm> shapes = {
      {256, 768, 2304}, {256, 768, 3072}, {256, 3072, 768}, {256, 768, 50304}, {2048, 2048, 2048}};
  std::printf("\nmatmul: x (M, K) @ W^T, W (N, K) as in nn.Linear; GFLOP/s\n");
  std::printf("%-20s %8s %12s %12s %8s\n", "M x K x N", "threads", "tessera", "raw Eigen", "ratio");
  Generator gen(1);
  for (const Gemm& s : shapes) {
    Tensor a = randn({s.m, s.k}, gen);
    Tensor b = randn({s.n, s.k}, gen);
    Tensor c = empty({s.m, s.n});
    const double flop = 2.0 * s.m * s.n * s.k;
    const int r = flop > 1e10 ? std::max(1, reps / 3) : reps;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const auto [t_ours, t_ref] = time_pair(
          r, [&] { kernels::matmul(a, b, false, true); },
          [&] {
            bench::eigen_gemm_nt(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), s.m,
                                 s.n, s.k);
          });
      const std::string shape =
          std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
      std::printf("%-20s %8d %12.1f %12.1f %8.3f\n", shape.c_str(), threads, flop / t_ours / 1e9,
                  flop / t_ref / 1e9, t_ref / t_ours);
    }
  }
}

// Causal attention forward and backward (kernels/attention.h) against the same products
// materialized the plain way: (B, H, T, T) scores by matmul, softmax, then matmul with V;
// its backward as the four matmuls and the softmax gradient. GFLOP/s count the causal half
// of the products: 2 T^2 D per head forward, 5 T^2 D backward (the scores recomputed).
void bench_attention(int reps) {
  struct Shape4 {
    int64_t b, h, t, d;
  };
  std::printf(
      "\ncausal attention (B, H, T, D), f32: GFLOP/s of the causal products; reference "
      "materializes (T, T)\n");
  std::printf("%-22s %-9s %8s %12s %12s %8s\n", "B x H x T x D", "pass", "threads", "tessera",
              "materialized", "ratio");
  Generator gen(3);
  for (const Shape4 s : {Shape4{4, 12, 64, 64}, Shape4{1, 12, 1024, 64}}) {
    const Shape shape{s.b, s.h, s.t, s.d};
    const Tensor q = randn(shape, gen), k = randn(shape, gen), v = randn(shape, gen);
    const Tensor dout = randn(shape, gen);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    const kernels::AttentionOutput fwd = kernels::causal_attention(q, k, v, scale);
    const Tensor probs = kernels::softmax(kernels::matmul(q, k, false, true));  // (B, H, T, T)
    const double heads = static_cast<double>(s.b * s.h);
    const double flop_fwd = heads * 2.0 * s.t * s.t * s.d;
    const std::string name = std::to_string(s.b) + "x" + std::to_string(s.h) + "x" +
                             std::to_string(s.t) + "x" + std::to_string(s.d);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const auto [t_fwd, t_fwd_ref] = time_pair(
          reps, [&] { kernels::causal_attention(q, k, v, scale); },
          [&] { kernels::matmul(kernels::softmax(kernels::matmul(q, k, false, true)), v); });
      const auto [t_bwd, t_bwd_ref] = time_pair(
          reps, [&] { kernels::causal_attention_backward(dout, q, k, v, fwd.out, fwd.lse, scale); },
          [&] {
            kernels::matmul(probs, dout, true, false);  // dV
            const Tensor dp = kernels::matmul(dout, v, false, true);
            const Tensor ds = kernels::softmax_backward(dp, probs);
            kernels::matmul(ds, k);               // dQ
            kernels::matmul(ds, q, true, false);  // dK
          });
      std::printf("%-22s %-9s %8d %12.1f %12.1f %8.3f\n", name.c_str(), "forward", threads,
                  flop_fwd / t_fwd / 1e9, flop_fwd / t_fwd_ref / 1e9, t_fwd_ref / t_fwd);
      std::printf("%-22s %-9s %8d %12.1f %12.1f %8.3f\n", name.c_str(), "backward", threads,
                  2.5 * flop_fwd / t_bwd / 1e9, 2.5 * flop_fwd / t_bwd_ref / 1e9,
                  t_bwd_ref / t_bwd);
    }
  }
}

// A memcpy moving `bytes` (each byte read once and written once), split across threads.
std::function<void()> memcpy_of(std::vector<char>& src, std::vector<char>& dst) {
  return [&src, &dst] {
    char* d = dst.data();
    const char* s = src.data();
    parallel_for(static_cast<int64_t>(src.size()), 1 << 20,
                 [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, e - b); });
  };
}

void bench_bandwidth(int reps) {
  std::printf(
      "\nmemory-bound kernels: GB/s of reads + writes; reference memcpy of the same bytes\n");
  std::printf("%-34s %8s %10s %10s %8s\n", "kernel", "threads", "kernel", "memcpy", "ratio");
  Generator gen(2);
  struct Case {
    std::string name;
    double traffic;  // bytes read + written
    std::function<void()> run;
  };
  const int64_t rows = 8192, c = 768;
  Tensor x = randn({rows, c}, gen);
  Tensor w = randn({c}, gen), bias = randn({c}, gen);
  Tensor logits = randn({1024, 8192}, gen);
  Tensor act = randn({8 << 20}, gen);
  const int64_t n_params = 32 << 20;
  Tensor p = randn({n_params}, gen), g = randn({n_params}, gen);
  Tensor m = zeros({n_params}), v = zeros({n_params});
  kernels::AdamWParams hp;
  hp.weight_decay = 0.1;
  const double f = sizeof(float);
  std::vector<Case> cases = {
      {"layer_norm fwd (8192, 768)", 2.0 * rows * c * f,
       [&] { kernels::layer_norm(x, w, bias, 1e-5); }},
      {"softmax fwd (1024, 8192)", 2.0 * logits.numel() * f, [&] { kernels::softmax(logits); }},
      {"gelu fwd (8M)", 2.0 * act.numel() * f,
       [&] { kernels::unary(kernels::UnaryOp::gelu, act); }},
      {"adamw step (32M params)", 7.0 * n_params * f, [&] { kernels::adamw_step(p, g, m, v, hp); }},
  };
  for (const Case& k : cases) {
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<char> src(static_cast<size_t>(k.traffic / 2), 1), dst(src.size());
      const auto [t, t_ref] = time_pair(reps, k.run, memcpy_of(src, dst));
      std::printf("%-34s %8d %10.1f %10.1f %8.3f\n", k.name.c_str(), threads, k.traffic / t / 1e9,
                  k.traffic / t_ref / 1e9, t_ref / t);
    }
  }
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  int reps = 9;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "cpu_kernels_bench: unknown argument \"%s\"; expected --reps N\n",
                   argv[i]);
      return 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "cpu_kernels_bench: expected --reps >= 1, found %d\n", reps);
    return 2;
  }
  std::printf("Tessera CPU kernel benchmark (median of %d runs; ratio = reference time / ours)\n",
              reps);
  tessera::bench_matmul(reps);
  tessera::bench_attention(reps);
  tessera::bench_bandwidth(reps);
  return 0;
}
