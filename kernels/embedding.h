// Embedding lookup and its gradient (scatter-add of rows).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

// out[..., :] = weight[ids[...], :]; an id outside [0, V) is an error naming the id and
// its position.
Tensor embedding(const Tensor& weight, const Tensor& ids);  // (V, C), (...) i32|i64 -> (..., C)
// dweight[v, :] = sum of grad rows whose id is v.
Tensor embedding_backward(const Tensor& grad, const Tensor& ids,
                          int64_t num_embeddings);  // (..., C), (...) -> (V, C)
// dweight[v, :] += the sum of grad rows whose id is v, summed in position order first: on
// the CPU bitwise dweight + embedding_backward(grad, ids, V); on CUDA the sum is added in
// f32 and rounded once (f16/bf16 round once instead of twice). Rows without ids are
// untouched. dweight: contiguous (V, C) of grad's dtype and device.
void embedding_backward_add_(const Tensor& dweight, const Tensor& grad,
                             const Tensor& ids);  // (V, C) += (..., C) by (...)

}  // namespace tessera::kernels
