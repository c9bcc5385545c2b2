// Reductions over dims. `dims` empty means all dims; negative dims count from the end.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessera::kernels {

// Sum over `dims`; keepdim keeps them as size 1. f32 sums accumulate in f64-free pairwise
// blocks so long rows stay accurate.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Variance with `correction` (1 = unbiased, as torch.var's default).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim);

struct MaxResult {
  Tensor values;   // x's dtype
  Tensor indices;  // i64, the first maximum along dim
};
// Maximum along one dim.
MaxResult max(const Tensor& x, int64_t dim, bool keepdim);
// Index (i64) of the first maximum along one dim.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim);

}  // namespace tessera::kernels
