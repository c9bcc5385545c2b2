// Reductions: forward and backward side by side.
#include "autograd/ops/reduce.h"

#include <algorithm>

#include "autograd/ops/elementwise.h"
#include "autograd/record.h"
#include "core/factories.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace tessera {
namespace {

// The reduced dims of a `rank`-dim tensor as sorted non-negative indices.
std::vector<int64_t> reduced_dims(const std::vector<int64_t>& dims, int64_t rank, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(normalize_dim(d, rank, op));
  std::sort(out.begin(), out.end());
  return out;
}

// Shape of x with the reduced dims kept as size 1 (what keepdim=true returns).
Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& reduced) {
  Shape s = shape;
  for (int64_t d : reduced) s[d] = 1;
  return s;
}

// Broadcasts a reduced gradient back over x's shape (a view; consumers read it).
Tensor expand_back(const Tensor& g, const Shape& kept, const Shape& shape) {
  return g.reshape(kept).expand(shape);
}

int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& reduced) {
  int64_t n = 1;
  for (int64_t d : reduced) n *= shape[d];
  return n;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::sum(x, dims, keepdim);
  const std::vector<int64_t> red = reduced_dims(dims, x.dim(), "sum");
  record_function("sum", {x}, {&out},
                  [kept = keepdim_shape(x.shape(), red), shape = x.shape()](const TensorList& g) {
                    return TensorList{expand_back(g[0], kept, shape).contiguous()};
                  });
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = kernels::mean(x, dims, keepdim);
  const std::vector<int64_t> red = reduced_dims(dims, x.dim(), "mean");
  const double n = static_cast<double>(reduced_count(x.shape(), red));
  record_function(
      "mean", {x}, {&out},
      [kept = keepdim_shape(x.shape(), red), shape = x.shape(), n](const TensorList& g) {
        Tensor scaled = kernels::binary(kernels::BinaryOp::div, g[0], scalar_like(g[0], n));
        return TensorList{expand_back(scaled, kept, shape).contiguous()};
      });
  return out;
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  Tensor out = kernels::var(x, dims, correction, keepdim);
  const std::vector<int64_t> red = reduced_dims(dims, x.dim(), "var");
  const double n = static_cast<double>(reduced_count(x.shape(), red));
  record_function("var", {x}, {&out},
                  [x = x.detach(), kept = keepdim_shape(x.shape(), red), red, n,
                   correction](const TensorList& g) {
                    // d var / dx = 2 (x - mean) / (n - correction).
                    using kernels::BinaryOp;
                    Tensor centered =
                        kernels::binary(BinaryOp::sub, x, kernels::mean(x, red, true));
                    Tensor scale = kernels::binary(
                        BinaryOp::div, g[0].reshape(kept),
                        scalar_like(g[0], (n - static_cast<double>(correction)) / 2.0));
                    return TensorList{kernels::binary(BinaryOp::mul, centered, scale)};
                  });
  return out;
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  kernels::MaxResult r = kernels::max(x, dim, keepdim);
  const int64_t d = normalize_dim(dim, x.dim(), "max");
  record_function(
      "max", {x}, {&r.values}, [idx = r.indices, shape = x.shape(), d](const TensorList& g) {
        // The gradient goes where the position along d equals the argmax.
        Shape kept = shape;
        kept[d] = 1;
        Shape along(shape.size(), 1);
        along[d] = shape[d];
        Tensor positions = arange(shape[d], {DType::i64, idx.device()}).reshape(along);
        Tensor hit = kernels::compare(kernels::CompareOp::eq, positions, idx.reshape(kept));
        return TensorList{kernels::where(hit, g[0].reshape(kept), scalar_like(g[0], 0.0))};
      });
  return r.values;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return kernels::argmax(x.detach(), dim, keepdim);
}

}  // namespace tessera
