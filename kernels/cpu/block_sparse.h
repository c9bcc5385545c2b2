// CPU block-sparse attention kernels (see kernels/block_sparse.h).
#pragma once

#include "kernels/block_sparse.h"

namespace tessera::kernels::cpu {

// a, b (B, H, T, D) -> (B, nnz, block, block).
Tensor block_sparse_sdd(const Tensor& a, const Tensor& b, const BlockLayout& layout);
// s (B, nnz, block, block), x (B, H, T, D) -> (B, H, T, D).
Tensor block_sparse_dsd(const Tensor& s, const Tensor& x, const BlockLayout& layout,
                        bool transpose_s);
// x (B, nnz, block, block) -> (B, nnz, block, block).
Tensor block_sparse_softmax(const Tensor& x, const BlockLayout& layout,
                            const BlockSoftmaxOptions& options);
// y, dy (B, nnz, block, block) -> (B, nnz, block, block).
Tensor block_sparse_softmax_backward(const Tensor& y, const Tensor& dy, const BlockLayout& layout,
                                     double scale);

}  // namespace tessera::kernels::cpu
