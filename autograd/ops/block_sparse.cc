// Block-sparse attention ops: forward and backward side by side. The backward of each
// product is the other two products (DeepSpeed's mode permutation, deepspeed.md 3.2):
// SDD's gradients are DSDs and DSD's are an SDD and a transposed DSD.
#include "autograd/ops/block_sparse.h"

#include "autograd/record.h"

namespace tessera {

Tensor sdd_matmul(const Tensor& a, const Tensor& b, const kernels::BlockLayout& layout) {
  Tensor out = kernels::block_sparse_sdd(a, b, layout);
  record_function("sdd_matmul", {a, b}, {&out},
                  [a = a.detach(), b = b.detach(), layout](const TensorList& g) {
                    // out = a b^T on the blocks: da = g b, db = g^T a.
                    return TensorList{kernels::block_sparse_dsd(g[0], b, layout, false),
                                      kernels::block_sparse_dsd(g[0], a, layout, true)};
                  });
  return out;
}

Tensor sparse_softmax(const Tensor& x, const kernels::BlockLayout& layout,
                      const kernels::BlockSoftmaxOptions& options) {
  Tensor y = kernels::block_sparse_softmax(x, layout, options);
  record_function(
      "sparse_softmax", {x}, {&y},
      [y = y.detach(), layout, scale = options.scale](const TensorList& g) {
        return TensorList{kernels::block_sparse_softmax_backward(y, g[0], layout, scale)};
      });
  return y;
}

Tensor dsd_matmul(const Tensor& s, const Tensor& x, const kernels::BlockLayout& layout) {
  Tensor out = kernels::block_sparse_dsd(s, x, layout, false);
  record_function("dsd_matmul", {s, x}, {&out},
                  [s = s.detach(), x = x.detach(), layout](const TensorList& g) {
                    // out = s x: ds = g x^T on the blocks, dx = s^T g.
                    return TensorList{kernels::block_sparse_sdd(g[0], x, layout),
                                      kernels::block_sparse_dsd(s, g[0], layout, true)};
                  });
  return out;
}

}  // namespace tessera
