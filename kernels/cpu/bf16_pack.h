// Packing of bf16 GEMM operands into pairs along k (Note [BF16 GEMM] in
// kernels/cpu/bf16_gemm.h), shared by the AVX512_BF16 and AMX kernels.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/half.h"
#include "kernels/cpu/bf16_gemm.h"

namespace tessera::kernels::cpu::bf16 {

// A pair of bf16 values along k, the first in the low half: the element of both kernels'
// packed B (a "VNNI" layout) and of the AVX512_BF16 kernel's packed A.
using Word = uint32_t;

// Columns of a packed B micro-panel: three vectors of 16 words.
inline constexpr int kPanelCols = 48;

// Frees a buffer from std::aligned_alloc.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
// A 64-byte aligned buffer of `count` words (contents undefined).
using AlignedWords = std::unique_ptr<Word[], FreeDeleter>;
AlignedWords aligned_words(int64_t count);
// A 64-byte aligned buffer of `count` bf16 values (contents undefined).
using AlignedBf16 = std::unique_ptr<BFloat16[], FreeDeleter>;
AlignedBf16 aligned_bf16(int64_t count);

// The least multiple of `to` that is at least x (x >= 0, to > 0).
inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// The pair starting at `first` as one word; `first` may sit at any 2-byte address.
inline Word load_word(const BFloat16* first) {
  Word w;
  std::memcpy(&w, first, sizeof(w));
  return w;
}

// Packs b (k, n) into ceil(n / kPanelCols) micro-panels of `pairs_stride` rows each (at
// least ceil(k / 2)): row p holds the kPanelCols words (b[2p][j], b[2p+1][j]), zero past
// column n, past row k and in the rows past ceil(k / 2).
void pack_b(Bf16Matrix b, int64_t k, int64_t n, int64_t pairs_stride, Word* dst);

// Packs a (m, k) into ceil(m / rows) micro-panels of `rows` (8 or 16) rows: for each pair p
// of k, `rows` words (a[i][2p], a[i][2p+1]), zero past row m and past column k.
void pack_a_pairs(Bf16Matrix a, int64_t m, int64_t k, int rows, Word* dst);

// Copies a (m, k) into a row-major (round_up(m, 32), k_pad) block, k_pad >= k even, zero
// past row m and column k: the AMX kernel's A tiles read its rows.
void pack_a_rows(Bf16Matrix a, int64_t m, int64_t k, int64_t k_pad, BFloat16* dst);

}  // namespace tessera::kernels::cpu::bf16
