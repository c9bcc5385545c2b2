// Differentiable block-sparse attention ops (DeepSpeed's sparse_attention MatMul and
// Softmax): the kernels of kernels/block_sparse.h with their backward.
#pragma once

#include "core/tensor.h"
#include "kernels/block_sparse.h"

namespace tessera {

// Scores of the layout's blocks only: out[n, z] = a[n, h, block i] . b[n, h, block j]^T for
// each nonzero z = (h, i, j) (Note [Block-sparse format] in kernels/block_sparse.h).
Tensor sdd_matmul(const Tensor& a, const Tensor& b,
                  const kernels::BlockLayout& layout);  // (B, H, T, D) x2 -> (B, nnz, b, b)

// The row-wise softmax of scale x + masks over each query row's blocks; options as
// kernels::BlockSoftmaxOptions (masks are not differentiated).
Tensor sparse_softmax(const Tensor& x, const kernels::BlockLayout& layout,
                      const kernels::BlockSoftmaxOptions& options);  // (B, nnz, b, b)

// Sparse times dense: out[n, h, block i] = sum over z = (h, i, j) of s[n, z] . x[n, h, block j].
Tensor dsd_matmul(const Tensor& s, const Tensor& x,
                  const kernels::BlockLayout& layout);  // (B, nnz, b, b), (B, H, T, D)

}  // namespace tessera
