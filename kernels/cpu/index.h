// CPU concatenation and indexed gather/scatter; inputs are validated by kernels/index.cc,
// `dim` is already normalized.
#pragma once

#include "kernels/index.h"

namespace tessera::kernels::cpu {

Tensor cat(const std::vector<Tensor>& xs, int64_t dim);  // (..., n_i, ...) -> (..., sum n_i, ...)
Tensor index_select(const Tensor& x, int64_t dim,
                    const Tensor& index);  // (..., n, ...), (L) -> (..., L, ...)
void index_add_(const Tensor& out, int64_t dim, const Tensor& index,
                const Tensor& src);  // (..., n, ...), (L), (..., L, ...)

}  // namespace tessera::kernels::cpu
