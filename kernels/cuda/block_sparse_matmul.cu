// cuda::block_sparse_sdd and cuda::block_sparse_dsd: the products of block-sparse attention
// (see Note [Block-sparse format] in kernels/block_sparse.h).
//
// Note [Block-sparse products on CUDA]
// A thread block of 256 threads (a 16 x 16 grid, tx = threadIdx.x % 16, ty = threadIdx.x / 16)
// owns one output tile and writes each of its elements exactly once, so there are no
// atomics and every run gives the same bits:
// - SDD: a (kTile, kTile) tile of one nonzero block z = (h, i, j) of one batch entry,
//   a[n, h, block i] . b[n, h, block j]^T summed over D, kChunk columns of D at a time.
// - DSD: a (kTile, kDc) tile (positions of block row i, a chunk of D) of one (batch, head),
//   summed over the nonzeros of block row i in layout order (row_start / nz_col), or with
//   transpose_s over those of block column j (col_start / col_nz / nz_row), kChunk
//   positions of each nonzero block at a time. Block rows without nonzeros write zeros.
// kTile is the block rounded up to 16, 32 or 64; a larger block is cut into 64-wide tiles.
// Operands are staged in shared memory in acc_t<T>, k-major (reduction index first, rows
// padded by one), so a half warp reads 16 consecutive words. Each thread accumulates the
// micro-tile of rows ty + 16 ii and columns tx + 16 jj with CUDA-core FMAs; rows and columns
// past the block or D load as zeros and are not stored.
#include <cstdint>
#include <type_traits>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kChunk = 32;               // reduction elements staged per step
constexpr int kDc = 64;                  // columns of D per DSD tile
constexpr int64_t kMaxGrid = 65535 * 8;  // blocks per launch; the tile loops do the rest

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Stages the (kRows, kCols) tile src[r * ld + c] in shared memory, zeros where r >= rows or
// c >= cols: as dst[c * (kRows + 1) + r] when kTranspose, else dst[r * (kCols + 1) + c].
// Consecutive threads read consecutive c, so global reads coalesce along src rows.
template <int kRows, int kCols, bool kTranspose, class T, class A>
__device__ __forceinline__ void stage(A* dst, const T* src, int64_t ld, int64_t rows,
                                      int64_t cols) {
  for (int e = threadIdx.x; e < kRows * kCols; e += blockDim.x) {
    const int r = e / kCols;
    const int c = e % kCols;
    const A v = r < rows && c < cols ? to_acc(src[r * ld + c]) : A(0);
    if constexpr (kTranspose) {
      dst[c * (kRows + 1) + r] = v;
    } else {
      dst[r * (kCols + 1) + c] = v;
    }
  }
}

// acc[ii][jj] += sum over k of lhs[k][ty + 16 ii] rhs[k][tx + 16 jj].
template <int kR, int kC, int kLdL, int kLdR, class A>
__device__ __forceinline__ void accumulate(A (&acc)[kR][kC],
                                           const A* lhs,  // (kChunk, kLdL)
                                           const A* rhs,  // (kChunk, kLdR)
                                           int ty, int tx) {
#pragma unroll 8
  for (int k = 0; k < kChunk; ++k) {
    A l[kR], r[kC];
#pragma unroll
    for (int ii = 0; ii < kR; ++ii) l[ii] = lhs[k * kLdL + ty + 16 * ii];
#pragma unroll
    for (int jj = 0; jj < kC; ++jj) r[jj] = rhs[k * kLdR + tx + 16 * jj];
#pragma unroll
    for (int ii = 0; ii < kR; ++ii)
#pragma unroll
      for (int jj = 0; jj < kC; ++jj) acc[ii][jj] += l[ii] * r[jj];
  }
}

template <class T, int kTile>
__global__ void __launch_bounds__(kThreads)
    sdd_kernel(const T* __restrict__ a,             // (B, H, T, D)
               const T* __restrict__ b,             // (B, H, T, D)
               T* __restrict__ out,                 // (B, nnz, block, block)
               const int32_t* __restrict__ nz_row,  // (nnz): h nb + i
               const int32_t* __restrict__ nz_col,  // (nnz): j
               int64_t batch, int64_t heads, int64_t nb, int64_t block, int64_t nnz, int64_t dim) {
  using A = acc_t<T>;
  constexpr int kM = kTile / 16;
  constexpr int kLd = kTile + 1;
  __shared__ A as[kChunk * kLd];  // (kChunk, kTile): a rows, k-major
  __shared__ A bs[kChunk * kLd];  // (kChunk, kTile): b rows, k-major
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  const int64_t sub = (block + kTile - 1) / kTile;  // tiles along each edge of a block
  const int64_t len = nb * block;
  const int64_t tiles = batch * nnz * sub * sub;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / sub) % sub * kTile;
    const int64_t c0 = t % sub * kTile;
    const int64_t z = t / (sub * sub) % nnz;
    const int64_t n = t / (sub * sub * nnz);
    const int64_t h = nz_row[z] / nb;
    const int64_t i = nz_row[z] % nb;
    const int64_t j = nz_col[z];
    const int64_t rows = min64(kTile, block - r0);
    const int64_t cols = min64(kTile, block - c0);
    const T* ap = a + ((n * heads + h) * len + i * block + r0) * dim;
    const T* bp = b + ((n * heads + h) * len + j * block + c0) * dim;
    A acc[kM][kM] = {};
    for (int64_t d0 = 0; d0 < dim; d0 += kChunk) {
      const int64_t width = min64(kChunk, dim - d0);
      __syncthreads();  // the previous chunk's (or tile's) readers are done
      stage<kTile, kChunk, true>(as, ap + d0, dim, rows, width);
      stage<kTile, kChunk, true>(bs, bp + d0, dim, cols, width);
      __syncthreads();
      accumulate<kM, kM, kLd, kLd>(acc, as, bs, ty, tx);
    }
    T* op = out + ((n * nnz + z) * block + r0) * block + c0;
#pragma unroll
    for (int ii = 0; ii < kM; ++ii) {
#pragma unroll
      for (int jj = 0; jj < kM; ++jj) {
        const int r = ty + 16 * ii;
        const int c = tx + 16 * jj;
        if (r < rows && c < cols) op[r * block + c] = from_acc<T>(acc[ii][jj]);
      }
    }
  }
}

// kTranspose: out block j = sum over the column's z = (h, i, j) of s[z]^T . x block i;
// else out block i = sum over the row's z = (h, i, j) of s[z] . x block j.
template <class T, int kTile, bool kTranspose>
__global__ void __launch_bounds__(kThreads)
    dsd_kernel(const T* __restrict__ s,             // (B, nnz, block, block)
               const T* __restrict__ x,             // (B, H, T, D)
               T* __restrict__ out,                 // (B, H, T, D)
               const int32_t* __restrict__ start,   // (H nb + 1): row_start or col_start
               const int32_t* __restrict__ col_nz,  // (nnz): used when kTranspose
               const int32_t* __restrict__ other,   // (nnz): nz_col, or nz_row when kTranspose
               int64_t batch, int64_t heads, int64_t nb, int64_t block, int64_t nnz, int64_t dim) {
  using A = acc_t<T>;
  constexpr int kM = kTile / 16;
  constexpr int kN = kDc / 16;
  constexpr int kLdS = kTile + 1;
  constexpr int kLdX = kDc + 1;
  __shared__ A ss[kChunk * kLdS];  // (kChunk, kTile): s (or s^T) columns, k-major
  __shared__ A xs[kChunk * kLdX];  // (kChunk, kDc): x rows
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  const int64_t sub = (block + kTile - 1) / kTile;
  const int64_t chunks = (dim + kDc - 1) / kDc;
  const int64_t len = nb * block;
  const int64_t tiles = batch * heads * nb * sub * chunks;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t d0 = t % chunks * kDc;
    const int64_t p0 = t / chunks % sub * kTile;
    const int64_t blk = t / (chunks * sub) % nb;  // the output's block row (or column)
    const int64_t nh = t / (chunks * sub * nb);   // n H + h
    const int64_t h = nh % heads;
    const int64_t n = nh / heads;
    const int64_t rows = min64(kTile, block - p0);
    const int64_t cols = min64(kDc, dim - d0);
    A acc[kM][kN] = {};
    for (int64_t q = start[h * nb + blk]; q < start[h * nb + blk + 1]; ++q) {
      const int64_t z = kTranspose ? col_nz[q] : q;
      const int64_t o = kTranspose ? other[z] - h * nb : other[z];  // x's block
      const T* sp = s + (n * nnz + z) * block * block;
      const T* xp = x + (nh * len + o * block) * dim + d0;
      for (int64_t k0 = 0; k0 < block; k0 += kChunk) {
        const int64_t width = min64(kChunk, block - k0);
        __syncthreads();  // the previous chunk's (or tile's) readers are done
        if constexpr (kTranspose) {
          stage<kChunk, kTile, false>(ss, sp + k0 * block + p0, block, width, rows);
        } else {
          stage<kTile, kChunk, true>(ss, sp + p0 * block + k0, block, rows, width);
        }
        stage<kChunk, kDc, false>(xs, xp + k0 * dim, dim, width, cols);
        __syncthreads();
        accumulate<kM, kN, kLdS, kLdX>(acc, ss, xs, ty, tx);
      }
    }
    T* op = out + (nh * len + blk * block + p0) * dim + d0;
#pragma unroll
    for (int ii = 0; ii < kM; ++ii) {
#pragma unroll
      for (int jj = 0; jj < kN; ++jj) {
        const int r = ty + 16 * ii;
        const int c = tx + 16 * jj;
        if (r < rows && c < cols) op[r * dim + c] = from_acc<T>(acc[ii][jj]);
      }
    }
  }
}

// Calls f(std::integral_constant<int, kTile>{}) with the tile edge for blocks of `block`.
template <class F>
void dispatch_tile(int64_t block, F&& f) {
  if (block <= 16) {
    f(std::integral_constant<int, 16>{});
  } else if (block <= 32) {
    f(std::integral_constant<int, 32>{});
  } else {
    f(std::integral_constant<int, 64>{});
  }
}

unsigned grid_of(int64_t tiles) {
  return static_cast<unsigned>(tiles < 1 ? 1 : tiles > kMaxGrid ? kMaxGrid : tiles);
}

const int32_t* table(const Tensor& t) { return ptr<const int32_t>(t); }

}  // namespace

Tensor block_sparse_sdd(const Tensor& a_in, const Tensor& b_in, const BlockLayout& layout) {
  constexpr const char* op = "block_sparse_sdd";
  const Tensor a = a_in.detach().contiguous();  // (B, H, T, D)
  const Tensor b = b_in.detach().contiguous();  // (B, H, T, D)
  const int64_t batch = a.size(0);
  const int64_t block = layout.block;
  Tensor out = empty({batch, layout.nnz, block, block}, {a.dtype(), a.device()});
  if (out.numel() == 0) return out;
  set_device(op, a);
  const int64_t dim = a.size(3);
  dispatch_cuda_floating(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_tile(block, [&](auto tile) {
      constexpr int kTile = decltype(tile)::value;
      const int64_t sub = (block + kTile - 1) / kTile;
      sdd_kernel<T, kTile><<<grid_of(batch * layout.nnz * sub * sub), kThreads, 0, kStream>>>(
          ptr<T>(a), ptr<T>(b), ptr<T>(out), table(layout.nz_row), table(layout.nz_col), batch,
          layout.heads, layout.blocks, block, layout.nnz, dim);
      check_launch(op);
    });
  });
  return out;
}

Tensor block_sparse_dsd(const Tensor& s_in, const Tensor& x_in, const BlockLayout& layout,
                        bool transpose_s) {
  constexpr const char* op = "block_sparse_dsd";
  const Tensor s = s_in.detach().contiguous();  // (B, nnz, block, block)
  const Tensor x = x_in.detach().contiguous();  // (B, H, T, D)
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  if (out.numel() == 0) return out;
  set_device(op, x);
  const int64_t batch = x.size(0);
  const int64_t dim = x.size(3);
  const int64_t block = layout.block;
  dispatch_cuda_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_tile(block, [&](auto tile) {
      constexpr int kTile = decltype(tile)::value;
      const int64_t sub = (block + kTile - 1) / kTile;
      const unsigned grid =
          grid_of(batch * layout.heads * layout.blocks * sub * ((dim + kDc - 1) / kDc));
      if (transpose_s) {
        dsd_kernel<T, kTile, true><<<grid, kThreads, 0, kStream>>>(
            ptr<T>(s), ptr<T>(x), ptr<T>(out), table(layout.col_start), table(layout.col_nz),
            table(layout.nz_row), batch, layout.heads, layout.blocks, block, layout.nnz, dim);
      } else {
        dsd_kernel<T, kTile, false><<<grid, kThreads, 0, kStream>>>(
            ptr<T>(s), ptr<T>(x), ptr<T>(out), table(layout.row_start), nullptr,
            table(layout.nz_col), batch, layout.heads, layout.blocks, block, layout.nnz, dim);
      }
      check_launch(op);
    });
  });
  return out;
}

}  // namespace tessera::kernels::cuda
