// Block-sparse attention kernels (DeepSpeed's sparse_attention ops): SDD scores, the
// block-row softmax and DSD products, over a block layout.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

// Note [Block-sparse format]
// A layout (H, nb, nb) of 0/1 says which (query block-row i, key block-column j) pairs of
// each head are computed; a position t lies in block t / block. A sparse tensor is
// (B, nnz, block, block): the nonzero blocks in the layout's nonzero() order (head-major,
// then row, then column), DeepSpeed's format, so memory is O(nnz x block^2) and never
// (T, T). BlockLayout keeps the index tables the kernels walk, on their device: the
// nonzeros by (head, row) and by (head, column). Every output element is owned by one
// worker that reads one of those lists, so the kernels need no atomics and give the same
// bits on every run.
struct BlockLayout {
  int64_t heads = 0;   // H
  int64_t blocks = 0;  // nb: block rows (and block columns) of each head
  int64_t block = 0;   // edge of a block, in positions
  int64_t nnz = 0;     // nonzero blocks over all heads
  // Nonzeros z of (head h, block row i) are [row_start[h nb + i], row_start[h nb + i + 1]).
  Tensor row_start;  // i32 (H nb + 1)
  Tensor nz_col;     // i32 (nnz): block column j of nonzero z
  Tensor nz_row;     // i32 (nnz): h nb + i of nonzero z
  // The nonzeros of (head h, block column j), by row: col_nz[col_start[h nb + j] ...].
  Tensor col_start;  // i32 (H nb + 1)
  Tensor col_nz;     // i32 (nnz)

  int64_t seq_len() const { return blocks * block; }
  Device device() const { return row_start.device(); }
};

// The tables of `layout` (H, nb, nb), any integer or bool dtype on the CPU (nonzero means
// attend), for blocks of `block` positions, placed on `device`.
BlockLayout make_block_layout(const Tensor& layout, int64_t block, Device device);

// SDD ("sparse = dense x dense^T"): for each nonzero z = (h, i, j),
//   out[n, z] = a[n, h, block i] . b[n, h, block j]^T.
// a, b (B, H, T, D) with T = nb x block; returns (B, nnz, block, block).
Tensor block_sparse_sdd(const Tensor& a, const Tensor& b, const BlockLayout& layout);

// DSD ("dense = sparse x dense"): out[n, h, block i] = sum over z = (h, i, j) of
// s[n, z] . x[n, h, block j]. With transpose_s the blocks are transposed and the sum runs
// over each column: out[n, h, block j] = sum over z = (h, i, j) of s[n, z]^T . x[n, h, block i].
// s (B, nnz, block, block), x (B, H, T, D); returns (B, H, T, D), zero where no block lands.
Tensor block_sparse_dsd(const Tensor& s, const Tensor& x, const BlockLayout& layout,
                        bool transpose_s);

// How a mask enters the scores (DeepSpeed's key_padding_mask_mode / attn_mask_mode):
// `add` adds its values; `mul` turns entries equal to 0 into -inf and leaves the rest.
enum class MaskMode : uint8_t { add, mul };

struct BlockSoftmaxOptions {
  double scale = 1.0;       // multiplies the scores before the masks
  bool causal = false;      // key position > query position counts as -inf
  Tensor key_padding_mask;  // (B, T) of the scores' dtype, or undefined
  MaskMode key_padding_mode = MaskMode::add;
  Tensor attn_mask;  // (T, T) of the scores' dtype, or undefined
  MaskMode attn_mask_mode = MaskMode::mul;
};

// The softmax of each query row over all its layout's blocks:
//   y = softmax(scale x + masks), entries outside the layout counting as -inf.
// A row with every entry at -inf gets probabilities 0 (DeepSpeed's kernel gives NaN).
// x (B, nnz, block, block) -> (B, nnz, block, block).
Tensor block_sparse_softmax(const Tensor& x, const BlockLayout& layout,
                            const BlockSoftmaxOptions& options);

// The gradient of the scores: dx = scale y (dy - sum over the row of y dy).
// y, dy (B, nnz, block, block) -> (B, nnz, block, block).
Tensor block_sparse_softmax_backward(const Tensor& y, const Tensor& dy, const BlockLayout& layout,
                                     double scale);

}  // namespace tessera::kernels
