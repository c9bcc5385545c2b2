// Single-threaded f32 GEMM with packed panels and an AVX-512 register-blocked micro-kernel.
//
// Note [Packed SGEMM]
// C = A B for row-major C, with A and B read through (row stride, column stride) so every
// transpose and leading dimension is a stride. The loops follow the Goto/BLIS scheme with
// the vector dimension along N (C's rows are contiguous): a KC x NC block of B is packed
// into micro-panels of kNr columns (for each k, kNr values), and the micro-kernel keeps a
// kMr x kNr tile of C in 24 zmm registers while it walks k, one A micro-panel of kMr rows
// (L1) against the B micro-panels of the block (L2), broadcasting one A value per row and
// k. When A's rows are contiguous along k (the forward's activations, the backward's output
// gradients) the micro-kernel reads them in place; otherwise an MC x KC block of A is
// packed into micro-panels (for each k, kMr values). Packing a row-major A is a 16 x 16
// transpose per 128 values: it took 7-8% of the GPT-2 step's forward and input-gradient
// products, which reading in place saves. B's full micro-panels are read in place too when
// its rows are contiguous along n (the backward's weights and activations): 4-6% faster on
// the input gradients than packing them. Otherwise B is packed, with the same transposes
// when its source is the other way round, about three times the cost per element of a
// plain copy. While a block's tiles compute, the next B block's source is prefetched a few
// lines per tile, so weights that come from DRAM do not stall the tiles or the packing.
// Edge tiles are computed in full on zero-padded panels and only their valid part is
// written; a last partial micro-panel of an in-place operand is packed.
//
// Note [f16 operands]
// f16 operands are never read in place: every value is converted to f32 (vcvtph2ps) where
// it would have been packed, so no widened copy of either operand is made. An A that meets
// a single B block is converted one micro-panel at a time just before its tiles, and one
// whose rows run along k into f32 rows, which the micro-kernel reads as it reads an A in
// place: the weight of the forward's C^T = W x^T then costs one conversion per value and
// no transpose. Otherwise A is packed in blocks as an f32 A is.
//
// Note [Transposed SGEMM]
// The forward's x W^T (256 tokens against a wide weight whose rows run along k) would pack
// the whole weight with transposes, for only 256 uses of each packed value: 5-6% of the
// products' time. sgemm computes such a product, where B's columns are contiguous along k
// and B is wider than A is tall, as C^T = B^T A^T instead: the weight becomes the A
// operand, read in place, and the tokens (A^T) are the packed B operand, packed once per
// k block (and per 1536 weight rows when the tokens span several B blocks). The micro-kernel's tile
// is stored transposed into C (each of its 32 token columns is one C row segment of 8 values). On
// the GPT-2 step's forward linears and LM head (standalone, 12 layers' weights from DRAM,
// interleaved with the old path) this is 3% faster on a quiet host and 9% faster while the host's
// memory is busy.
//
// Compared with a one-thread Eigen GEMM on the GPT-2 step's shapes (tools/bench) it is
// level on the forward products and 1.1-1.4x faster on the weight gradients (K = B x T).
// Threading stays with the caller (kernels/cpu/matmul.cc splits C into blocks).
#pragma once

#include <cstdint>

#include "kernels/cpu/strided_matrix.h"

namespace tessera::kernels::cpu {

// Whether this build has the packed kernel: it needs AVX-512F at compile time.
#if defined(__AVX512F__)
inline constexpr bool kHavePackedSgemm = true;
#else
inline constexpr bool kHavePackedSgemm = false;
#endif

// c (m, n), row-major with leading dimension ldc, = a (m, k) @ b (k, n), plus bias (n) on every
// row when bias is not null (linear's bias joins the first k block's sums instead of taking
// a pass of its own). Overwrites c; m, n, k >= 1. Defined only when kHavePackedSgemm.
void sgemm(StridedMatrix a, StridedMatrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
           const float* bias = nullptr);

// The same product of f16 operands, summed in f32 (Note [f16 operands]; Note [16-bit math
// on the CPU] in kernels/cpu/widen.h).
void sgemm(HalfMatrix a, HalfMatrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
           const float* bias = nullptr);

}  // namespace tessera::kernels::cpu
