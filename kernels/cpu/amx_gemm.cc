#include "kernels/cpu/amx_gemm.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/bf16_pack.h"

namespace tessera::kernels::cpu::bf16 {
namespace {

// A block of C is 32 x 32 f32 in tiles 0-3 ((rows, cols): 0 = (0, 0), 1 = (0, 16),
// 2 = (16, 0), 3 = (16, 16)); tiles 4 and 5 hold A's rows 0-15 and 16-31 over 32 values
// of k, tiles 6 and 7 B's columns 0-15 and 16-31 over the same 16 pairs. Every tile is
// 16 rows of 64 bytes. Blocks of k are kKc values (a multiple of 32), of n kNc columns (a
// multiple of both the 32 of a C block and the 48 of a packed B panel), and the packed B
// block (kKc x kNc bf16, 288 KiB) stays in L2 while the C blocks walk it.
constexpr int kTile = 16;
constexpr int kBlock = 2 * kTile;
constexpr int64_t kKc = 768;
constexpr int64_t kNc = 192;
constexpr int64_t kMc = 1536;
static_assert(kKc % kBlock == 0 && kNc % kBlock == 0 && kNc % kPanelCols == 0);

// ldtilecfg's 64-byte operand (Intel SDM, "Tile configuration"): palette 1, then the bytes
// per row and the rows of each tile.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Keeps the compiler from moving memory accesses across it: the tile loads and stores are
// asm statements that do not tell it which memory they touch.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

// c (32 x 32 f32, leading dimension ldc) = (or +=, when `accumulate`) a @ b over `pairs`
// pairs of k (a multiple of 16): a's 32 rows along k, lda elements apart; b0 and b1 the
// packed B columns 0-15 and 16-31 (panel rows kPanelCols words apart).
__attribute__((target("amx-tile,amx-bf16"))) void c_block(bool accumulate, int64_t pairs,
                                                          const BFloat16* a, int64_t lda,
                                                          const Word* b0, const Word* b1, float* c,
                                                          int64_t ldc) {
  const int64_t a_stride = lda * static_cast<int64_t>(sizeof(BFloat16));
  const int64_t b_stride = kPanelCols * static_cast<int64_t>(sizeof(Word));
  const int64_t c_stride = ldc * static_cast<int64_t>(sizeof(float));
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    _tile_loadd(1, c + kTile, c_stride);
    _tile_loadd(2, c + kTile * ldc, c_stride);
    _tile_loadd(3, c + kTile * ldc + kTile, c_stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t p = 0; p < pairs; p += kTile) {
    _tile_loadd(4, a + 2 * p, a_stride);
    _tile_loadd(5, a + kTile * lda + 2 * p, a_stride);
    _tile_loadd(6, b0 + p * kPanelCols, b_stride);
    _tile_loadd(7, b1 + p * kPanelCols, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride);
  _tile_stored(1, c + kTile, c_stride);
  _tile_stored(2, c + kTile * ldc, c_stride);
  _tile_stored(3, c + kTile * ldc + kTile, c_stride);
}

// The first word of the 16 packed B columns starting at column j of a block packed with
// `pairs` rows per panel.
const Word* b_columns(const Word* packed, int64_t j, int64_t pairs) {
  return packed + j / kPanelCols * pairs * kPanelCols + j % kPanelCols;
}

__attribute__((target("amx-tile,amx-bf16"))) void amx_gemm_tiles(Bf16Matrix a, Bf16Matrix b,
                                                                 float* c, int64_t ldc, int64_t m,
                                                                 int64_t n, int64_t k) {
  configure_tiles();
  const int64_t kc_max = std::min(kKc, round_up(k, kBlock));
  // A's rows are read in place where they run along k and each block of k is whole tiles
  // (and a C block's 32 rows are all there); the rest is copied, zero-padded, to `a_rows`.
  const bool a_along_k = a.col_stride == 1;
  const int64_t mc_block = a_along_k ? m : kMc;
  AlignedBf16 a_rows = aligned_bf16(round_up(std::min(mc_block, m), kBlock) * kc_max);
  // The packed B block: whole panels up to the last C block's 32 columns, which may reach
  // one panel past the columns' own.
  const int64_t b_cols = round_up(round_up(std::min(kNc, n), kBlock), kPanelCols);
  AlignedWords b_packed = aligned_words(b_cols * kc_max / 2);
  alignas(64) float edge[kBlock * kBlock];
  for (int64_t ic = 0; ic < m; ic += mc_block) {
    const int64_t mc = std::min(mc_block, m - ic);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      const int64_t kc_pad = round_up(kc, kBlock), padded_pairs = kc_pad / 2;
      const BFloat16* a_block = a.data + ic * a.row_stride + pc * a.col_stride;
      const int64_t rows_in_place = a_along_k && kc == kc_pad ? mc / kBlock * kBlock : 0;
      if (rows_in_place < mc) {
        pack_a_rows({a_block + rows_in_place * a.row_stride, a.row_stride, a.col_stride},
                    mc - rows_in_place, kc, kc_pad, a_rows.get());
      }
      for (int64_t jc = 0; jc < n; jc += kNc) {
        const int64_t nc = std::min(kNc, n - jc);
        const int64_t panels = round_up(round_up(nc, kBlock), kPanelCols) / kPanelCols;
        pack_b({b.data + pc * b.row_stride + jc * b.col_stride, b.row_stride, b.col_stride}, kc, nc,
               padded_pairs, b_packed.get());
        const int64_t packed_panels = (nc + kPanelCols - 1) / kPanelCols;
        std::fill(b_packed.get() + packed_panels * padded_pairs * kPanelCols,
                  b_packed.get() + panels * padded_pairs * kPanelCols, Word{0});
        memory_barrier();
        for (int64_t ir = 0; ir < mc; ir += kBlock) {
          const bool in_place = ir < rows_in_place;
          const BFloat16* a_tile =
              in_place ? a_block + ir * a.row_stride : a_rows.get() + (ir - rows_in_place) * kc_pad;
          const int64_t lda = in_place ? a.row_stride : kc_pad;
          for (int64_t jr = 0; jr < nc; jr += kBlock) {
            const Word* b0 = b_columns(b_packed.get(), jr, padded_pairs);
            const Word* b1 = b_columns(b_packed.get(), jr + kTile, padded_pairs);
            float* cb = c + (ic + ir) * ldc + jc + jr;
            const int64_t rows = std::min<int64_t>(kBlock, mc - ir);
            const int64_t cols = std::min<int64_t>(kBlock, nc - jr);
            if (rows == kBlock && cols == kBlock) {
              c_block(pc > 0, padded_pairs, a_tile, lda, b0, b1, cb, ldc);
              continue;
            }
            if (pc > 0) {
              for (int64_t i = 0; i < rows; ++i) {
                std::memcpy(edge + i * kBlock, cb + i * ldc, cols * sizeof(float));
              }
            }
            memory_barrier();
            c_block(pc > 0, padded_pairs, a_tile, lda, b0, b1, edge, kBlock);
            memory_barrier();
            for (int64_t i = 0; i < rows; ++i) {
              std::memcpy(cb + i * ldc, edge + i * kBlock, cols * sizeof(float));
            }
          }
        }
        memory_barrier();
      }
    }
  }
  _tile_release();
}

}  // namespace

__attribute__((target("amx-tile,amx-bf16"))) void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = kTile;
  }
  memory_barrier();  // ldtilecfg's asm declares only the first 8 bytes of `config` as read
  _tile_loadconfig(&config);
}

bool amx_usable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    // Linux: permission to use the tile data state (XFEATURE_XTILEDATA = 18).
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

void amx_gemm(Bf16Matrix a, Bf16Matrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
              const float* bias) {
  amx_gemm_tiles(a, b, c, ldc, m, n, k);
  if (bias == nullptr) return;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] += bias[j];
  }
}

}  // namespace tessera::kernels::cpu::bf16

#else

namespace tessera::kernels::cpu::bf16 {

bool amx_usable() { return false; }
void configure_tiles() {}
void amx_gemm(Bf16Matrix, Bf16Matrix, float*, int64_t, int64_t, int64_t, int64_t, const float*) {}

}  // namespace tessera::kernels::cpu::bf16

#endif  // __AVX512BF16__ && __AVX512BW__
