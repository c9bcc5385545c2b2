// The AMX tile kernel of the bf16 GEMM (Note [BF16 GEMM] in kernels/cpu/bf16_gemm.h).
// Callers use bf16_gemm with Bf16Kernel::amx; tools/perf's peak probe configures the
// tiles the kernel's way.
#pragma once

#include <cstdint>

#include "kernels/cpu/bf16_gemm.h"

namespace tessera::kernels::cpu::bf16 {

// Whether the CPU has AMX-BF16 and the Linux kernel grants this process the tile data
// state (arch_prctl ARCH_REQ_XCOMP_PERM, asked on the first call and remembered: the
// permission is the process's, for all its threads).
bool amx_usable();

// Configures this thread's eight tiles as the kernel uses them (16 rows of 64 bytes each);
// _tile_release() ends it. amx_usable() must be true.
void configure_tiles();

// bf16_gemm on AMX tiles; amx_usable() must be true.
void amx_gemm(Bf16Matrix a, Bf16Matrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
              const float* bias);

}  // namespace tessera::kernels::cpu::bf16
