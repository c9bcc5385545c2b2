// Shared pieces of the flash attention kernels (attention_forward.cu, attention_backward.cu):
// shared-memory tiles, the micro-tile products and the launch helpers.
//
// Note [Flash attention on CUDA]
// No (T, T) matrix ever reaches global memory. A block of 256 threads (a 16 x 16 grid,
// tx = threadIdx.x % 16, ty = threadIdx.x / 16) owns one tile of rows of one (batch, head)
// and streams the tiles of the other side through shared memory, FlashAttention-2 style:
//
// - Forward, grid (B*H, query tiles): a tile of Br query rows stays in shared memory while
//   the key/value tiles up to the diagonal stream past. Each thread computes a micro-tile
//   of scores (rows ty + 16 i, keys tx + 16 j), so the 16 threads of a row sit in one half
//   warp and reduce its max and sum with shuffles. The online softmax keeps a running max
//   m and sum l per row and rescales the output accumulator by exp(m_old - m_new); at the
//   end out = o / l and lse = m + log(l). Probabilities go through shared memory (in the
//   space of the key tile once the scores are done) into o += p v.
// - Backward first computes delta[t] = dout[t] . out[t]. Then two kernels recompute the
//   probabilities p = exp(scale q.k - lse) rather than storing them:
//   * dK/dV, grid (B*H, key tiles): a key/value tile stays while the query tiles at or
//     after it stream past; dv += p^T dout and dk += scale ds^T q with ds = p (dout.v -
//     delta), accumulated in registers (keys ty + 16 i). p and then ds pass through one
//     shared buffer, transposed so that a thread reads its keys' values as vectors.
//   * dQ, grid (B*H, query tiles): as the forward, dq += scale ds k.
//   Computing dq in its own pass costs a second recomputation of p and dout.v, but every
//   output element is written once by one thread, so results are bitwise deterministic
//   (no float atomics) and no partial-dq buffer is needed.
// Tiles live in shared memory in the accumulation type, rows padded by 16 bytes so that
// 16-byte vector reads by 16 different rows fall in different banks. Rows past T and
// columns past D load as zeros and causally masked scores become probability 0, so any T,
// any B*H and any D <= 128 work (D is rounded up to a compiled width of 32, 64, 96 or 128).
// Heavy tiles (many tiles to stream) are scheduled first.
//
// The products use CUDA-core FMAs in the accumulation type (f32 for f32/f16/bf16, f64 for
// f64). Tensor-core MMA (mma.sync / wgmma with f16/bf16 operands) is the next
// optimization for the half types; the tiling above is what it would keep.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/philox_block.h"
#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda::flash {

constexpr int kMaxHeadDim = 128;

// Elements of `A` in one 16-byte shared-memory vector; also the row padding of a tile.
template <class A>
constexpr int kVec = static_cast<int>(16 / sizeof(A));

template <int N, class A>
__device__ __forceinline__ Pack<A, N> load_vec(const A* p) {
  return *reinterpret_cast<const Pack<A, N>*>(p);
}

__device__ __forceinline__ float exp_acc(float x) { return ::expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return ::exp(x); }
__device__ __forceinline__ float max_acc(float a, float b) { return ::fmaxf(a, b); }
__device__ __forceinline__ double max_acc(double a, double b) { return ::fmax(a, b); }
__device__ __forceinline__ float log_acc(float x) { return ::logf(x); }
__device__ __forceinline__ double log_acc(double x) { return ::log(x); }

// The shape of the tiles of one kernel: kRows rows of its own side per thread (Br = 16 *
// kRows rows per block), kOther rows of the streamed side per thread (Bc = 16 * kOther).
template <class T, int kD, int kRows, int kOther>
struct Tiles {
  using A = acc_t<T>;
  static constexpr int kBr = 16 * kRows;                  // rows the block owns
  static constexpr int kBc = 16 * kOther;                 // rows of each streamed tile
  static constexpr int kLd = kD + kVec<A>;                // leading dim of a (rows, kD) tile
  static constexpr int kLdS = kBc + kVec<A>;              // of a (kBr, kBc) score tile
  static constexpr int kOwn = kBr * kLd;                  // elements of an owned (kBr, kD) tile
  static constexpr int kStream = kBc * kLd;               // of a streamed (kBc, kD) tile
  static constexpr int kScores = kBr * kLdS;              // of a score tile
  static constexpr bool kScoresFit = kScores <= kStream;  // can reuse a streamed tile
  static constexpr int kCols = kD / 16;                   // output columns per thread and row
  static constexpr int kVecO = kD % (16 * kVec<A>) == 0 ? kVec<A> : kVec<A> / 2;
  static constexpr int kGroups = kD / (16 * kVecO);  // vectors per output row per thread
  static_assert(kD % 32 == 0 && kGroups * kVecO == kCols);
};

// Copies rows [row0, row0 + kRows) of a (len, dim) matrix into a (kRows, kLd) tile in the
// accumulation type; rows past len and columns past dim read as zero.
template <int kRows, int kD, int kLd, class T>
__device__ void load_tile(acc_t<T>* tile, const T* src, int64_t row0, int64_t len, int dim) {
  for (int i = threadIdx.x; i < kRows * kD; i += kThreads) {
    const int r = i / kD;
    const int d = i % kD;
    const int64_t row = row0 + r;
    tile[r * kLd + d] = row < len && d < dim ? to_acc(src[row * dim + d]) : acc_t<T>(0);
  }
}

// Loads rows [row0, row0 + n) of a per-row statistic (lse, delta), zero past len.
template <class A>
__device__ void load_stat(A* dst, const A* src, int64_t row0, int64_t len, int n) {
  for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = row0 + i < len ? src[row0 + i] : A(0);
}

// acc[i][j] += x[ty + 16 i] . y[tx + 16 j] over kD for two (rows, kLd) tiles.
template <int kRX, int kRY, int kD, int kLd, class A>
__device__ __forceinline__ void tile_dots(A (&acc)[kRX][kRY], const A* x, const A* y, int ty,
                                          int tx) {
  constexpr int kV = kVec<A>;
#pragma unroll 2
  for (int d = 0; d < kD; d += kV) {
    Pack<A, kV> a[kRX], b[kRY];
#pragma unroll
    for (int i = 0; i < kRX; ++i) a[i] = load_vec<kV>(x + (ty + 16 * i) * kLd + d);
#pragma unroll
    for (int j = 0; j < kRY; ++j) b[j] = load_vec<kV>(y + (tx + 16 * j) * kLd + d);
#pragma unroll
    for (int i = 0; i < kRX; ++i)
#pragma unroll
      for (int j = 0; j < kRY; ++j)
#pragma unroll
        for (int e = 0; e < kV; ++e) acc[i][j] += a[i].v[e] * b[j].v[e];
  }
}

// acc[i][col] += sum_c w[ty + 16 i][c] * z[c][col] for a (rows, kN) weight tile w (leading
// dim kLdW) and a (kN, kLd) tile z; the thread's columns are those of Tiles::kVecO groups.
template <int kRX, int kN, int kLdW, class Cfg, class A>
__device__ __forceinline__ void tile_mix(A (&acc)[kRX][Cfg::kCols], const A* w, const A* z, int ty,
                                         int tx) {
  constexpr int kV = kVec<A>;
  constexpr int kVO = Cfg::kVecO;
#pragma unroll 2
  for (int c = 0; c < kN; c += kV) {
    Pack<A, kV> a[kRX];
#pragma unroll
    for (int i = 0; i < kRX; ++i) a[i] = load_vec<kV>(w + (ty + 16 * i) * kLdW + c);
#pragma unroll
    for (int e = 0; e < kV; ++e) {
#pragma unroll
      for (int h = 0; h < Cfg::kGroups; ++h) {
        const Pack<A, kVO> b = load_vec<kVO>(z + (c + e) * Cfg::kLd + h * 16 * kVO + tx * kVO);
#pragma unroll
        for (int i = 0; i < kRX; ++i)
#pragma unroll
          for (int k = 0; k < kVO; ++k) acc[i][h * kVO + k] += a[i].v[e] * b.v[k];
      }
    }
  }
}

// Writes factor[i] * acc[i] to rows row0 + ty + 16 i (< len) of a (len, dim) matrix.
template <int kRX, class Cfg, class T, class A>
__device__ void store_rows(T* dst, const A (&acc)[kRX][Cfg::kCols], const A (&factor)[kRX],
                           int64_t row0, int64_t len, int dim, int ty, int tx) {
  constexpr int kVO = Cfg::kVecO;
#pragma unroll
  for (int i = 0; i < kRX; ++i) {
    const int64_t row = row0 + ty + 16 * i;
    if (row >= len) continue;
#pragma unroll
    for (int h = 0; h < Cfg::kGroups; ++h)
#pragma unroll
      for (int k = 0; k < kVO; ++k) {
        const int d = h * 16 * kVO + tx * kVO + k;
        if (d < dim) dst[row * dim + d] = from_acc<T>(acc[i][h * kVO + k] * factor[i]);
      }
  }
}

// Note [Dropout in the flash kernels]
// With dropout (Note [Attention-probability dropout] in kernels/attention.h) each thread
// makes the Philox word of every probability it holds: (head, row, col) has the index
// idx = (head T + row) T + col and word idx % 4 of block offset + idx / 4, as
// kernels::dropout's element idx of the (B, H, T, T) probabilities. A thread's columns are
// 16 apart, so it makes one block per probability, four times the words the mask needs,
// and the tiles keep their layout. The forward scales what enters o += p v, not the row
// sums (lse stays undropped); the backward scales p for dv and dout . v for ds.
template <class A>
struct FlashDropout {
  uint64_t seed = 0;
  uint64_t offset = 0;
  float threshold = 0.0f;  // p, compared in float as kernels::dropout does; 0: none dropped
  A scale = A(1);          // 1 / (1 - p) in the accumulation type, as kernels::dropout's

  __host__ __device__ bool drops() const { return threshold > 0.0f; }
  // scale where the mask keeps probability (head, row, col), else 0.
  __device__ __forceinline__ A factor(int64_t head, int64_t row, int64_t col, int64_t len) const {
    const uint64_t idx = (static_cast<uint64_t>(head) * len + row) * len + col;
    const PhiloxWords r = philox_block(offset + idx / 4, 0, seed);
    return uniform_from_bits(r.w[idx % 4]) >= threshold ? scale : A(0);
  }
};

template <class A>
FlashDropout<A> flash_dropout(const AttentionDropout& dropout) {
  return {dropout.seed, dropout.offset, static_cast<float>(dropout.p),
          static_cast<A>(1.0 / (1.0 - dropout.p))};
}

// Opt-in shared memory of one block on sm_80 (163 KiB); sm_90 allows more.
constexpr size_t kMaxSharedBytes = 163 * 1024;

// Calls f(std::integral_constant<int, kD>{}) with the compiled width for head dim `dim`.
template <class F>
inline void dispatch_head_dim(const char* op, int64_t dim, F&& f) {
  TS_CHECK(dim <= kMaxHeadDim, "[", op, "] expected a head dim D <= ", kMaxHeadDim,
           " on CUDA, found ", dim);
  if (dim <= 32) return f(std::integral_constant<int, 32>{});
  if (dim <= 64) return f(std::integral_constant<int, 64>{});
  if (dim <= 96) return f(std::integral_constant<int, 96>{});
  return f(std::integral_constant<int, 128>{});
}

// Launches `kernel` on the compute stream with `smem` bytes of dynamic shared memory.
template <class... Params, class... Args>
void launch(const char* op, void (*kernel)(Params...), dim3 grid, size_t smem, Args... args) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem)),
             op, "cudaFuncSetAttribute");
  kernel<<<grid, kThreads, smem, kStream>>>(args...);
  check_launch(op);
}

// The grid of one head per x and `tiles` tiles of `rows` rows per y.
inline dim3 tile_grid(const char* op, int64_t heads, int64_t len, int rows) {
  const int64_t tiles = (len + rows - 1) / rows;
  TS_CHECK(tiles <= 65535 && heads <= 0x7fffffff, "[", op, "] expected at most 65535 tiles of ",
           rows, " positions and 2^31 - 1 heads, found T = ", len, " and B*H = ", heads);
  return dim3(static_cast<unsigned>(heads), static_cast<unsigned>(tiles));
}

// The dtype of lse: f32 for the half types, else the input's.
inline DType stat_dtype(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16 ? DType::f32 : dtype;
}

}  // namespace tessera::kernels::cuda::flash
