// Concatenation, splitting and indexed gather/scatter along a dim.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessera::kernels {

// Joins tensors that agree on every dim but `dim`; same dtype and device.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
// Views of consecutive pieces of `dim` with the given sizes (they must sum to its size).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// out = x with `dim` replaced by the entries `index` (1-D, i32|i64) picks.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out.select(dim, index[i]) += src.select(dim, i) for every i (duplicates accumulate).
void index_add_(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

}  // namespace tessera::kernels
