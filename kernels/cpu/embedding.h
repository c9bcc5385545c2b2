// CPU embedding gather and scatter-add; inputs are validated by kernels/embedding.cc.
#pragma once

#include "kernels/embedding.h"

namespace tessera::kernels::cpu {

Tensor embedding(const Tensor& weight, const Tensor& ids);  // (V, C), (...) -> (..., C)
Tensor embedding_backward(const Tensor& grad, const Tensor& ids,
                          int64_t num_embeddings);  // (..., C), (...) -> (V, C)
void embedding_backward_add_(const Tensor& dweight, const Tensor& grad,
                             const Tensor& ids);  // (V, C) += (..., C) by (...)

}  // namespace tessera::kernels::cpu
