#include "kernels/cpu/bf16_gemm.h"

#include "core/error.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/bf16_pack.h"

namespace tessera::kernels::cpu {
namespace {

using bf16::Word;

// The AVX512_BF16 kernel (Note [BF16 GEMM]). A tile is kMr rows by kNv vectors of kLanes
// columns: 8 x 3 accumulators, three B vectors and one broadcast fit the 32 zmm registers,
// as in the f32 kernel. A k block is kKc values (kKc / 2 pairs): an A micro-panel (kMr x kKc
// bf16, 12 KiB) stays in L1 while the packed B block (kKc x kNc bf16, 288 KiB) is read from
// L2, the footprint of the f32 kernel's blocks with twice the values of k.
constexpr int kLanes = 16;
constexpr int kMr = 8;
constexpr int kNv = 3;
constexpr int kNr = kNv * kLanes;
static_assert(kNr == bf16::kPanelCols);
constexpr int64_t kKc = 768;
constexpr int64_t kNc = 192;
constexpr int64_t kMc = 1536;

// kMr rows of A over a block's pairs, as the micro-kernel reads them: packed (for each pair,
// kMr words) or in place in a matrix whose rows run along k (row_stride elements apart).
struct APanel {
  const void* data;
  int64_t row_stride;  // 0 when packed
};

// c (kMr, kNr) = (or +=, when Accumulate) a @ b over `pairs` pairs of k, b a packed B
// micro-panel; row-major with leading dimension ldc. Unless Accumulate, a non-null bias is
// added, bias[j] to column j.
template <bool AInPlace, bool Accumulate>
inline void micro_kernel(int64_t pairs, const void* a_data, int64_t lda, const Word* __restrict b,
                         float* c, int64_t ldc, const float* bias) {
  const auto* a_packed = static_cast<const Word*>(a_data);
  const auto* a_rows = static_cast<const BFloat16*>(a_data);
  __m512 acc[kMr][kNv];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 3
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 3
    for (int v = 0; v < kNv; ++v) {
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + v * kLanes), _MM_HINT_T0);
    }
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < pairs; ++p, b += kNr) {
    __m512bh bv[kNv];
#pragma GCC unroll 3
    for (int v = 0; v < kNv; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + v * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const Word w = AInPlace ? bf16::load_word(a_rows + i * lda + 2 * p) : a_packed[p * kMr + i];
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
#pragma GCC unroll 3
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 3
    for (int v = 0; v < kNv; ++v) {
      float* cv = c + i * ldc + v * kLanes;
      if (Accumulate) {
        acc[i][v] = _mm512_add_ps(acc[i][v], _mm512_loadu_ps(cv));
      } else if (bias != nullptr) {
        acc[i][v] = _mm512_add_ps(acc[i][v], _mm512_loadu_ps(bias + v * kLanes));
      }
      _mm512_storeu_ps(cv, acc[i][v]);
    }
  }
}

template <bool Accumulate>
void micro_kernel(int64_t pairs, APanel a, const Word* b, float* c, int64_t ldc,
                  const float* bias) {
  if (a.row_stride != 0) {
    micro_kernel<true, Accumulate>(pairs, a.data, a.row_stride, b, c, ldc, bias);
  } else {
    micro_kernel<false, Accumulate>(pairs, a.data, 0, b, c, ldc, bias);
  }
}

// The micro-kernel on a tile with rows x cols valid entries (an edge tile goes through a
// local buffer so nothing past the edge of c or bias is touched).
void tile(bool accumulate, int64_t pairs, APanel a, const Word* b, float* c, int64_t ldc,
          int64_t rows, int64_t cols, const float* bias) {
  if (rows == kMr && cols == kNr) {
    if (accumulate) {
      micro_kernel<true>(pairs, a, b, c, ldc, nullptr);
    } else {
      micro_kernel<false>(pairs, a, b, c, ldc, bias);
    }
    return;
  }
  alignas(64) float buffer[kMr * kNr];
  micro_kernel<false>(pairs, a, b, buffer, kNr, nullptr);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const float first = bias == nullptr ? 0.0f : bias[j];
      float& out = c[i * ldc + j];
      out = (accumulate ? out : first) + buffer[i * kNr + j];
    }
  }
}

void avx512_gemm(Bf16Matrix a, Bf16Matrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
                 const float* bias) {
  using bf16::round_up;
  const int64_t kc_max = std::min(kKc, round_up(k, 2));
  // Rows contiguous along k with whole pairs in every block: full micro-panels are read in
  // place, and only a last partial one is packed.
  const bool a_in_place = a.col_stride == 1 && k % 2 == 0;
  const int64_t mc_block = a_in_place ? m : kMc;
  const int64_t a_pack_rows = a_in_place ? kMr : std::min(kMc, round_up(m, kMr));
  bf16::AlignedWords a_packed = bf16::aligned_words(a_pack_rows * kc_max / 2);
  bf16::AlignedWords b_packed = bf16::aligned_words(std::min(kNc, round_up(n, kNr)) * kc_max / 2);
  for (int64_t ic = 0; ic < m; ic += mc_block) {
    const int64_t mc = std::min(mc_block, m - ic);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      const int64_t pairs = (kc + 1) / 2;
      const Bf16Matrix a_block{a.data + ic * a.row_stride + pc * a.col_stride, a.row_stride,
                               a.col_stride};
      const int64_t mc_in_place = a_in_place ? mc / kMr * kMr : 0;
      if (mc_in_place < mc) {
        bf16::pack_a_pairs({a_block.data + mc_in_place * a.row_stride, a.row_stride, a.col_stride},
                           mc - mc_in_place, kc, kMr, a_packed.get());
      }
      const auto a_panel = [&](int64_t ir) -> APanel {
        if (ir < mc_in_place) return {a_block.data + ir * a.row_stride, a.row_stride};
        return {a_packed.get() + (ir - mc_in_place) * pairs, 0};
      };
      for (int64_t jc = 0; jc < n; jc += kNc) {
        const int64_t nc = std::min(kNc, n - jc);
        bf16::pack_b({b.data + pc * b.row_stride + jc * b.col_stride, b.row_stride, b.col_stride},
                     kc, nc, pairs, b_packed.get());
        for (int64_t ir = 0; ir < mc; ir += kMr) {
          for (int64_t jr = 0; jr < nc; jr += kNr) {
            const float* tile_bias = bias == nullptr ? nullptr : bias + jc + jr;
            tile(pc > 0, pairs, a_panel(ir), b_packed.get() + jr * pairs,
                 c + (ic + ir) * ldc + jc + jr, ldc, std::min<int64_t>(kMr, mc - ir),
                 std::min<int64_t>(kNr, nc - jr), tile_bias);
          }
        }
      }
    }
  }
}

}  // namespace

bool bf16_kernel_available(Bf16Kernel kernel) {
  return kernel == Bf16Kernel::avx512 || bf16::amx_usable();
}

Bf16Kernel best_bf16_kernel() { return bf16::amx_usable() ? Bf16Kernel::amx : Bf16Kernel::avx512; }

void bf16_gemm(Bf16Matrix a, Bf16Matrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
               const float* bias, Bf16Kernel kernel) {
  if (kernel == Bf16Kernel::amx) {
    TS_INTERNAL_ASSERT(bf16::amx_usable(), "the AMX bf16 kernel is not available here");
    bf16::amx_gemm(a, b, c, ldc, m, n, k, bias);
  } else {
    avx512_gemm(a, b, c, ldc, m, n, k, bias);
  }
}

}  // namespace tessera::kernels::cpu

#else  // no AVX512_BF16: products widen to f32 (kernels/cpu/matmul.cc)

namespace tessera::kernels::cpu {

bool bf16_kernel_available(Bf16Kernel) { return false; }
Bf16Kernel best_bf16_kernel() { return Bf16Kernel::avx512; }
void bf16_gemm(Bf16Matrix, Bf16Matrix, float*, int64_t, int64_t, int64_t, int64_t, const float*,
               Bf16Kernel) {
  TS_INTERNAL_ASSERT(false, "bf16_gemm needs AVX512_BF16 at compile time");
}

}  // namespace tessera::kernels::cpu

#endif  // __AVX512BF16__ && __AVX512BW__
