// Differentiable views, joins and gathers. The views alias x's storage as the raw
// Tensor methods do (core/tensor.h) and record the view for backward.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessera {

Tensor reshape(const Tensor& x, const Shape& shape);  // a view when the strides allow
Tensor view(const Tensor& x, const Shape& shape);     // always a view, or an error
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor contiguous(const Tensor& x);
// Converts to `dtype`; the gradient converts back.
Tensor cast(const Tensor& x, DType dtype);

Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// Entries of x along `dim` picked by `index` (1-D i32|i64; not differentiated).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

}  // namespace tessera
