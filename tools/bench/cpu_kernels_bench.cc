// CPU kernel benchmark: matmul GFLOP/s against raw Eigen GEMM, causal attention against
// the same attention materialized through matmul and softmax, and the bandwidth of the
// memory-bound kernels against a plain memcpy of the same bytes, all measured in one run
// so that a noisy machine still gives stable ratios.
//
//   bazel run //tools/bench:cpu_kernels_bench [-- --reps N] [--only matmul|attention|bandwidth]
#include <immintrin.h>

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
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/softmax.h"
#include "tools/bench/eigen_reference.h"

namespace tessera {
namespace {

// Median wall times of `reps` runs each of `a` and `b`, after one warm-up each. The runs
// alternate, so drift in the machine's speed (shared, throttled VMs) hits both alike.
// `before`, when given, runs untimed before every run of either.
std::pair<double, double> time_pair(int reps, const std::function<void()>& a,
                                    const std::function<void()>& b,
                                    const std::function<void()>& before = {}) {
  auto once = [&before](const std::function<void()>& fn) {
    if (before) before();
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
// of the products: 2 T^2 D per head forward, 5 T^2 D backward (the scores recomputed). The
// "+ dropout" rows drop probabilities at p = 0.1 (Note [Attention-probability dropout] in
// kernels/attention.h) against the materialized probabilities through kernels::dropout.
void bench_attention(int reps) {
  struct Shape4 {
    int64_t b, h, t, d;
  };
  std::printf(
      "\ncausal attention (B, H, T, D), f32: GFLOP/s of the causal products; reference "
      "materializes (T, T)\n");
  std::printf("%-22s %-15s %8s %12s %12s %8s\n", "B x H x T x D", "pass", "threads", "tessera",
              "materialized", "ratio");
  Generator gen(3);
  for (const Shape4 s : {Shape4{4, 12, 64, 64}, Shape4{1, 12, 1024, 64}}) {
    const Shape shape{s.b, s.h, s.t, s.d};
    const Tensor q = randn(shape, gen), k = randn(shape, gen), v = randn(shape, gen);
    const Tensor dout = randn(shape, gen);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
    const kernels::AttentionOutput fwd = kernels::causal_attention(q, k, v, scale);
    const Tensor probs = kernels::softmax(kernels::matmul(q, k, false, true));  // (B, H, T, T)
    const kernels::AttentionDropout dropout{0.1, 5, 0};
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
      const auto [t_drop, t_drop_ref] = time_pair(
          reps,
          [&] {
            const kernels::AttentionOutput o = kernels::causal_attention(q, k, v, scale, dropout);
            kernels::causal_attention_backward(dout, q, k, v, o.out, o.lse, scale, dropout);
          },
          [&] {
            const Tensor p = kernels::softmax(kernels::matmul(q, k, false, true));
            const Tensor dropped = kernels::dropout(p, dropout.p, dropout.seed, 0);
            kernels::matmul(dropped, v);
            kernels::matmul(dropped, dout, true, false);  // dV
            const Tensor dp = kernels::dropout_backward(kernels::matmul(dout, v, false, true),
                                                        dropout.p, dropout.seed, 0);
            const Tensor ds = kernels::softmax_backward(dp, p);
            kernels::matmul(ds, k);
            kernels::matmul(ds, q, true, false);
          });
      const auto row = [&](const char* pass, double flop, double ours, double ref) {
        std::printf("%-22s %-15s %8d %12.1f %12.1f %8.3f\n", name.c_str(), pass, threads,
                    flop / ours / 1e9, flop / ref / 1e9, ref / ours);
      };
      row("forward", flop_fwd, t_fwd, t_fwd_ref);
      row("backward", 2.5 * flop_fwd, t_bwd, t_bwd_ref);
      row("both + dropout", 3.5 * flop_fwd, t_drop, t_drop_ref);
    }
  }
}

// A memcpy of n bytes from src to dst, split across threads.
void parallel_memcpy(char* dst, const char* src, int64_t n) {
  parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) { std::memcpy(dst + b, src + b, e - b); });
}

// Writes back and drops every cache line of [p, p + bytes), on all cores.
void evict_from_caches(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) {
#if defined(__CLFLUSHOPT__)
    _mm_clflushopt(const_cast<char*>(c + i));  // takes a non-const pointer, writes nothing
#else
    _mm_clflush(c + i);
#endif
  }
  _mm_mfence();
}

// Note [Same pages]
// On these shared VMs the bandwidth of a buffer depends on where its pages landed: two
// kernels over different 32 MB tensors differed by 1.5x in one process, and the same
// kernel by as much between runs. So a kernel that reads `in` and writes a new tensor of
// its shape is compared with a memcpy of `in` into a fresh tensor of that shape: the
// caching allocator hands the kernel's output the very block the copy wrote (same-size
// blocks are reused last-in first-out), so both move the same bytes between the same pages.
// The table gives each ratio twice: "cold", with `in` and that block flushed from the
// caches before every run (cold_start_like), which measures memory; and "warm", as the
// previous run left them, which on these hosts (an L3 of hundreds of MB) is mostly L3 and
// depends on what the other run left there.
std::function<void()> memcpy_like(const Tensor& in) {
  return [&in] {
    Tensor out = empty(in.shape(), {in.dtype(), in.device()});
    parallel_memcpy(static_cast<char*>(out.raw_data()), static_cast<const char*>(in.raw_data()),
                    static_cast<int64_t>(in.nbytes()));
  };
}
std::function<void()> cold_start_like(const Tensor& in) {
  return [&in] {
    const Tensor out = empty(in.shape(), {in.dtype(), in.device()});  // the block both write
    evict_from_caches(in.raw_data(), in.nbytes());
    evict_from_caches(out.raw_data(), out.nbytes());
  };
}

void bench_bandwidth(int reps) {
  std::printf(
      "\nmemory-bound kernels: GB/s of reads + writes; reference memcpy of the same bytes;\n"
      "cold: operands flushed from the caches before each run; warm: as the last run left them\n");
  std::printf("%-28s %7s | %6s %6s %6s | %6s %6s %6s\n", "kernel", "threads", "cold", "memcpy",
              "ratio", "warm", "memcpy", "ratio");
  Generator gen(2);
  struct Case {
    std::string name;
    double traffic;  // bytes read + written
    std::function<void()> run;
    std::function<void()> reference;  // a memcpy moving the same bytes
    std::function<void()> before;     // untimed, before each run of either
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
  // AdamW updates in place: its reference copies 3.5 parameters' worth between buffers of
  // its own, so its ratio is subject to the placement Note [Same pages] describes.
  std::vector<char> src(static_cast<size_t>(3.5 * n_params * f), 1), dst(src.size());
  std::vector<Case> cases = {
      {"layer_norm fwd (8192, 768)", 2.0 * rows * c * f,
       [&] { kernels::layer_norm(x, w, bias, 1e-5); }, memcpy_like(x), cold_start_like(x)},
      {"softmax fwd (1024, 8192)", 2.0 * logits.numel() * f, [&] { kernels::softmax(logits); },
       memcpy_like(logits), cold_start_like(logits)},
      {"gelu fwd (8M)", 2.0 * act.numel() * f, [&] { kernels::unary(kernels::UnaryOp::gelu, act); },
       memcpy_like(act), cold_start_like(act)},
      {"adamw step (32M params)", 7.0 * n_params * f, [&] { kernels::adamw_step(p, g, m, v, hp); },
       [&] { parallel_memcpy(dst.data(), src.data(), static_cast<int64_t>(src.size())); },
       [&] {
         for (const Tensor* t : {&p, &g, &m, &v}) evict_from_caches(t->raw_data(), t->nbytes());
         evict_from_caches(src.data(), src.size());
         evict_from_caches(dst.data(), dst.size());
       }},
  };
  for (const Case& k : cases) {
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const auto [cold, cold_ref] = time_pair(reps, k.run, k.reference, k.before);
      const auto [warm, warm_ref] = time_pair(reps, k.run, k.reference);
      std::printf("%-28s %7d | %6.1f %6.1f %6.3f | %6.1f %6.1f %6.3f\n", k.name.c_str(), threads,
                  k.traffic / cold / 1e9, k.traffic / cold_ref / 1e9, cold_ref / cold,
                  k.traffic / warm / 1e9, k.traffic / warm_ref / 1e9, warm_ref / warm);
    }
  }
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  int reps = 9;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::string(argv[i]) == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "cpu_kernels_bench: unknown argument \"%s\"; expected --reps N or --only "
                   "matmul|attention|bandwidth\n",
                   argv[i]);
      return 2;
    }
  }
  if (!only.empty() && only != "matmul" && only != "attention" && only != "bandwidth") {
    std::fprintf(stderr,
                 "cpu_kernels_bench: expected --only matmul, attention or bandwidth, found "
                 "\"%s\"\n",
                 only.c_str());
    return 2;
  }
  if (reps < 1) {
    std::fprintf(stderr, "cpu_kernels_bench: expected --reps >= 1, found %d\n", reps);
    return 2;
  }
  std::printf("Tessera CPU kernel benchmark (median of %d runs; ratio = reference time / ours)\n",
              reps);
  if (only.empty() || only == "matmul") tessera::bench_matmul(reps);
  if (only.empty() || only == "attention") tessera::bench_attention(reps);
  if (only.empty() || only == "bandwidth") tessera::bench_bandwidth(reps);
  return 0;
}
