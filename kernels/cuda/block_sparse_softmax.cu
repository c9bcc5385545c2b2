// cuda::block_sparse_softmax and its backward: the softmax of each query row over the
// nonzero blocks of its block row (see Note [Block-sparse format] in kernels/block_sparse.h).
//
// Note [Block-sparse softmax on CUDA]
// One warp owns one query row (n, h, i, r) and walks the row's nonzeros of block row i
// (row_start / nz_col) as one flat list of count x block entries, lane by lane, so every
// output element is written by one thread and the results are the same bits on every run.
// The forward reads the scores twice: an online maximum and sum (rows::MaxSum), then
// exp(v - max) / sum, recomputing the masked score v each time rather than holding the row.
// A row whose entries are all -inf (masked, or causal above the diagonal) gets zeros.
#include <cmath>
#include <cstdint>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/rows.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kWarps = kThreads / 32;    // rows per thread block
constexpr int64_t kMaxGrid = 65535 * 8;  // blocks per launch; the row loops do the rest

// The row of one warp and where its entries live. Entry e of the row is column e % block
// of its (e / block)-th nonzero block.
struct Row {
  int64_t n;      // batch entry
  int64_t query;  // query position i block + r
  int64_t first;  // offset of the row in its first nonzero block: ((n nnz + z0) block + r) block
  int32_t z0;     // first nonzero of the block row
  int64_t count;  // entries: nonzeros of the block row x block
};

__device__ __forceinline__ Row row_of(int64_t row, const int32_t* row_start, int64_t heads,
                                      int64_t nb, int64_t block, int64_t nnz) {
  Row w;
  const int64_t r = row % block;
  const int64_t hi = row / block % (heads * nb);  // h nb + i
  w.n = row / (block * heads * nb);
  w.query = hi % nb * block + r;
  w.z0 = row_start[hi];
  w.first = ((w.n * nnz + w.z0) * block + r) * block;
  w.count = (row_start[hi + 1] - w.z0) * block;
  return w;
}

// Offset of entry e of the row: the next nonzero block is block x block elements further.
__device__ __forceinline__ int64_t entry_offset(const Row& w, int64_t e, int64_t block) {
  return w.first + e / block * block * block + e % block;
}

template <class T>
struct Masks {
  acc_t<T> scale;
  bool causal;
  const T* key_padding;  // (B, T), or null
  bool key_padding_mul;
  const T* attn;  // (T, T), or null
  bool attn_mul;
};

// The score of entry e of the row after scale and masks; -inf where masked.
template <class T>
__device__ __forceinline__ acc_t<T> masked_score(const T* x, const Row& w, int64_t e,
                                                 const int32_t* nz_col, int64_t block, int64_t len,
                                                 const Masks<T>& m) {
  using A = acc_t<T>;
  const int64_t key = nz_col[w.z0 + e / block] * block + e % block;
  if (m.causal && key > w.query) return A(-INFINITY);
  A v = m.scale * to_acc(x[entry_offset(w, e, block)]);
  if (m.key_padding != nullptr) {
    const A k = to_acc(m.key_padding[w.n * len + key]);
    if (!m.key_padding_mul) {
      v += k;
    } else if (k == A(0)) {
      return A(-INFINITY);
    }
  }
  if (m.attn != nullptr) {
    const A k = to_acc(m.attn[w.query * len + key]);
    if (!m.attn_mul) {
      v += k;
    } else if (k == A(0)) {
      return A(-INFINITY);
    }
  }
  return v;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_kernel(const T* __restrict__ x,                // (B, nnz, block, block)
                   T* __restrict__ y,                      // (B, nnz, block, block)
                   const int32_t* __restrict__ row_start,  // (H nb + 1)
                   const int32_t* __restrict__ nz_col,     // (nnz)
                   int64_t batch, int64_t heads, int64_t nb, int64_t block, int64_t nnz,
                   Masks<T> masks) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t rows = batch * heads * nb * block;
  const int64_t len = nb * block;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const Row w = row_of(row, row_start, heads, nb, block, nnz);
    rows::MaxSum<A> mine;
    for (int64_t e = lane; e < w.count; e += 32) {
      mine.add(masked_score(x, w, e, nz_col, block, len, masks));
    }
    const A top = warp_max(mine.max);
    // A lane at -inf below a finite maximum adds exp(-inf) = 0 (Note [Infinite logits]).
    const A sum = warp_sum(mine.max == top ? mine.sum : mine.sum * rows::exp_acc(mine.max - top));
    const bool empty_row = top == A(-INFINITY);
    const A inv = empty_row ? A(0) : A(1) / sum;
    for (int64_t e = lane; e < w.count; e += 32) {
      const A v = masked_score(x, w, e, nz_col, block, len, masks);
      y[entry_offset(w, e, block)] = from_acc<T>(empty_row ? A(0) : rows::exp_acc(v - top) * inv);
    }
  }
}

// dx = scale y (dy - sum over the row of y dy).
template <class T>
__global__ void __launch_bounds__(kThreads)
    softmax_backward_kernel(const T* __restrict__ y,                // (B, nnz, block, block)
                            const T* __restrict__ dy,               // (B, nnz, block, block)
                            T* __restrict__ dx,                     // (B, nnz, block, block)
                            const int32_t* __restrict__ row_start,  // (H nb + 1)
                            int64_t batch, int64_t heads, int64_t nb, int64_t block, int64_t nnz,
                            acc_t<T> scale) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t rows = batch * heads * nb * block;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const Row w = row_of(row, row_start, heads, nb, block, nnz);
    A mine = A(0);
    for (int64_t e = lane; e < w.count; e += 32) {
      const int64_t o = entry_offset(w, e, block);
      mine += to_acc(y[o]) * to_acc(dy[o]);
    }
    const A dot = warp_sum(mine);
    for (int64_t e = lane; e < w.count; e += 32) {
      const int64_t o = entry_offset(w, e, block);
      dx[o] = from_acc<T>(scale * to_acc(y[o]) * (to_acc(dy[o]) - dot));
    }
  }
}

unsigned grid_for_rows(int64_t rows) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxGrid ? kMaxGrid : blocks);
}

// The device pointer of an optional mask, made contiguous into `keep`.
template <class T>
const T* mask_ptr(const Tensor& mask, Tensor& keep) {
  if (!mask.defined()) return nullptr;
  keep = mask.detach().contiguous();
  return ptr<const T>(keep);
}

}  // namespace

Tensor block_sparse_softmax(const Tensor& x_in, const BlockLayout& layout,
                            const BlockSoftmaxOptions& options) {
  constexpr const char* op = "block_sparse_softmax";
  const Tensor x = x_in.detach().contiguous();  // (B, nnz, block, block)
  Tensor y = empty(x.shape(), {x.dtype(), x.device()});
  if (y.numel() == 0) return y;
  set_device(op, x);
  const int64_t batch = x.size(0);
  const int64_t rows = batch * layout.heads * layout.blocks * layout.block;
  dispatch_cuda_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    Tensor key_padding, attn;  // keep the contiguous masks alive through the launch
    const Masks<T> masks{static_cast<A>(options.scale),
                         options.causal,
                         mask_ptr<T>(options.key_padding_mask, key_padding),  // (B, T)
                         options.key_padding_mode == MaskMode::mul,
                         mask_ptr<T>(options.attn_mask, attn),  // (T, T)
                         options.attn_mask_mode == MaskMode::mul};
    softmax_kernel<T><<<grid_for_rows(rows), kThreads, 0, kStream>>>(
        ptr<T>(x), ptr<T>(y), ptr<const int32_t>(layout.row_start),
        ptr<const int32_t>(layout.nz_col), batch, layout.heads, layout.blocks, layout.block,
        layout.nnz, masks);
    check_launch(op);
  });
  return y;
}

Tensor block_sparse_softmax_backward(const Tensor& y_in, const Tensor& dy_in,
                                     const BlockLayout& layout, double scale) {
  constexpr const char* op = "block_sparse_softmax_backward";
  const Tensor y = y_in.detach().contiguous();    // (B, nnz, block, block)
  const Tensor dy = dy_in.detach().contiguous();  // (B, nnz, block, block)
  Tensor dx = empty(y.shape(), {y.dtype(), y.device()});
  if (dx.numel() == 0) return dx;
  set_device(op, y);
  const int64_t batch = y.size(0);
  const int64_t rows = batch * layout.heads * layout.blocks * layout.block;
  dispatch_cuda_floating(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T><<<grid_for_rows(rows), kThreads, 0, kStream>>>(
        ptr<T>(y), ptr<T>(dy), ptr<T>(dx), ptr<const int32_t>(layout.row_start), batch,
        layout.heads, layout.blocks, layout.block, layout.nnz, static_cast<acc_t<T>>(scale));
    check_launch(op);
  });
  return dx;
}

}  // namespace tessera::kernels::cuda
