// The machine's measured fp32 FMA peak: the denominator of MFU on the CPU.
#pragma once

namespace tessera::perf {

// FLOP/s (an FMA counts 2) of dependent-chain-free fused multiply-adds at the widest vector
// width this binary was compiled for, on `threads` threads (0: all), measured for about
// `seconds`.
double measure_fma_peak(int threads = 0, double seconds = 0.2);

}  // namespace tessera::perf
