// Single-threaded bf16 GEMM with f32 accumulation: on AMX tiles where the CPU has them,
// otherwise on AVX512_BF16's dot-product instruction.
//
// Note [BF16 GEMM]
// A bf16 product C = A B sums the exact products of pairs of bf16 values along k in f32:
//  - AVX512_BF16's vdpbf16ps multiplies 16 pairs by 16 other pairs and adds both products of
//    each pair to one f32 lane: 32 multiply-adds per instruction. The kernel follows Note
//    [Packed SGEMM] in kernels/cpu/sgemm.h with k taken in pairs: a tile of C (8 rows by 3
//    vectors of 16 columns) stays in f32 registers while it walks the pairs of k,
//    broadcasting one pair of A per row (a 32-bit word) against 3 packed vectors of B. On
//    Zen 4 an instruction issues as often as an f32 FMA, which doubles the rate; on an Intel
//    Xeon with AMX it issues half as often (tools/perf/fma_peak measured 241 against the
//    FMA's 481 GFLOP/s on two cores), so there the tiles below do the work.
//  - AMX (Intel Sapphire Rapids and later) multiplies tiles: tdpbf16ps adds a 16 x 32 bf16
//    tile of A times a 32 x 16 tile of B, 8192 multiply-adds, into a 16 x 16 f32 tile of C.
//    The kernel keeps a 32 x 32 block of C in four tiles and walks k 32 values at a time,
//    loading two A tiles (rows of A along k, read in place or from a padded copy) and two
//    B tiles.
// Both read B packed into micro-panels of 48 columns whose row p holds the pairs
// (b[2p][j], b[2p+1][j]) (the "VNNI" layout of both instructions): from a row-major source
// (the backward's weights and activations) by interleaving two rows, from a column-major
// one (the forward's x W^T, whose pairs are adjacent already) by 16 x 16 transposes of
// 32-bit words. An odd k gets a zero second half in its last pair; AMX pads k to 32. The
// sum over k is f32 throughout, in an order that differs between the kernels, and the
// caller rounds C once.
#pragma once

#include <cstdint>

#include "core/half.h"
#include "kernels/cpu/strided_matrix.h"

namespace tessera::kernels::cpu {

// Whether this build has the kernels: they need AVX512_BF16 (and AVX512BW) at compile
// time. Without them bf16 products widen their operands to f32 (Note [16-bit math on the
// CPU]).
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
inline constexpr bool kHaveBf16Gemm = true;
#else
inline constexpr bool kHaveBf16Gemm = false;
#endif

enum class Bf16Kernel {
  amx,     // Intel AMX tiles (tdpbf16ps)
  avx512,  // AVX512_BF16's vdpbf16ps
};

// Whether `kernel` runs on this machine: avx512 wherever kHaveBf16Gemm; amx where the CPU
// also has AMX-BF16 and the kernel grants the process the tile state (asked once).
bool bf16_kernel_available(Bf16Kernel kernel);
// amx where available, else avx512.
Bf16Kernel best_bf16_kernel();

// c (m, n) f32, row-major with leading dimension ldc >= n, = a (m, k) @ b (k, n) summed in f32,
// plus bias (n, f32) on every row when bias is not null, on `kernel` (which must be
// available). Overwrites c; m, n, k >= 1.
void bf16_gemm(Bf16Matrix a, Bf16Matrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
               const float* bias, Bf16Kernel kernel);

}  // namespace tessera::kernels::cpu
