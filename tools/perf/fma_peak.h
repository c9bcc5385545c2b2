// The machine's measured fp32 FMA peak and bf16 dot-product peak: the denominators of MFU
// on the CPU (f32 runs, and bf16 runs whose products use Note [BF16 GEMM]).
#pragma once

namespace tessera::perf {

// FLOP/s (an FMA counts 2) of dependent-chain-free fused multiply-adds at the widest vector
// width this binary was compiled for, on `threads` threads (0: all), measured for about
// `seconds`.
double measure_fma_peak(int threads = 0, double seconds = 0.2);

// FLOP/s of the instruction the bf16 GEMM runs on (Note [BF16 GEMM] in
// kernels/cpu/bf16_gemm.h), measured the same way: AMX's tdpbf16ps (16 x 16 x 32
// multiply-adds) where the CPU has AMX, else AVX512_BF16's vdpbf16ps (32 multiply-adds);
// the FMA peak when this binary has no AVX512_BF16 (its bf16 products are f32 FMAs then).
double measure_bf16_peak(int threads = 0, double seconds = 0.2);

}  // namespace tessera::perf
