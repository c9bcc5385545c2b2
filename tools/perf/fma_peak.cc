#include "tools/perf/fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/bf16_gemm.h"

namespace tessera::perf {
namespace {

// Note [Measuring the FMA peak]
// Each thread runs 16 independent accumulator registers through acc = acc * a + b, enough
// chains to cover the FMA latency (4 cycles) on two ports; the chain loop is unrolled so the
// accumulators stay in registers. Intrinsics, not plain C++: in ISO C++ mode GCC does not
// contract a * b + c into an FMA.
constexpr int kChains = 16;

#if defined(__AVX512F__)
constexpr int kLanes = 16;
double run(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.01f * c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_reduce_add_ps(s);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
double run(int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + 0.01f * c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  alignas(32) float out[8];
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  _mm256_store_ps(out, s);
  double total = 0;
  for (float v : out) total += v;
  return total;
}
#else
constexpr int kLanes = 1;
double run(int64_t iters) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 1.0f + 0.01f * c;
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = std::fma(acc[c], 0.999999f, 1e-7f);
  }
  double total = 0;
  for (float v : acc) total += v;
  return total;
}
#endif

#if defined(__AVX512BF16__)
// kChains accumulators through acc += a . b over pairs of bf16 (Note [BF16 GEMM] in
// kernels/cpu/bf16_gemm.h): 64 FLOPs per instruction.
double run_bf16(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + 0.01f * c);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999f), _mm512_set1_ps(0.998f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_reduce_add_ps(s);
}

// AMX: tdpbf16ps on four accumulator tiles from operand tiles that stay loaded, 16 x 16
// results of 32 products each: 16384 FLOPs per instruction. The tile state is set up and
// released around each call (the bf16 GEMM's own configuration, kernels/cpu/amx_gemm.cc).
__attribute__((target("amx-tile,amx-bf16"))) double run_amx(int64_t iters) {
  alignas(64) uint16_t operand[16 * 32];
  for (auto& v : operand) v = 0x3f80;  // bf16 1.0
  // The tile asm does not declare the memory it reads: the stores above come first.
  asm volatile("" ::: "memory");
  kernels::cpu::bf16::configure_tiles();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
#endif

// FLOP/s of `kernel` (flops_per_iter per call iteration on one thread) on `threads` threads
// for about `seconds`: the iteration count is calibrated on one thread, then the best of
// two timed runs of all threads together.
template <class Kernel>
double measure(Kernel kernel, double flops_per_iter, int threads, double seconds) {
  if (threads <= 0) threads = omp_get_max_threads();
  // Calibrate on one thread, then time all threads together.
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile double sink = kernel(iters);
    (void)sink;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > seconds / 4) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * seconds / dt);
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int rep = 0; rep < 2; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    double sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += kernel(iters);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sink == 42.0) return 0;  // keeps the work alive
    best = std::max(best, flops_per_iter * static_cast<double>(iters) * threads / dt);
  }
  return best;
}

}  // namespace

double measure_fma_peak(int threads, double seconds) {
  return measure(run, 2.0 * kLanes * kChains, threads, seconds);
}

double measure_bf16_peak(int threads, double seconds) {
#if defined(__AVX512BF16__)
  if (kernels::cpu::best_bf16_kernel() == kernels::cpu::Bf16Kernel::amx) {
    return measure(run_amx, 4 * 16384.0, threads, seconds);
  }
  return measure(run_bf16, 64.0 * kChains, threads, seconds);
#else
  return measure_fma_peak(threads, seconds);
#endif
}

}  // namespace tessera::perf
