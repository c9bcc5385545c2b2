// Differentiable reductions. `dims` empty means all dims; negative dims count from the end.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessera {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Variance with `correction` (1: unbiased, torch.var's default).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
// Maximum along `dim`; the gradient flows to the first maximal element.
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
// Index (i64) of the first maximum along `dim` (no gradient).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace tessera
