// Validation and the device switch of the index family; split is views on any device.
#include "kernels/index.h"

#include "core/grad_mode.h"
#include "kernels/checks.h"
#include "kernels/cpu/index.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

void check_index_tensor(const char* op, const Tensor& index, const Tensor& x) {
  check_defined(op, "index", index);
  TS_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, "[", op,
           "] expected an index of dtype i32 or i64, found ", dtype_name(index.dtype()));
  TS_CHECK(index.dim() == 1, "[", op, "] expected a 1-D index, found shape ",
           shape_str(index.shape()));
  check_same_device(op, "x", x, "index", index);
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {  // (..., n_i, ...) -> (..., sum n_i, ...)
  TS_CHECK(!xs.empty(), "[cat] expected at least one tensor, found none");
  for (const Tensor& x : xs) check_defined("cat", "every input", x);
  const Tensor& first = xs.front();
  TS_CHECK(first.dim() > 0, "[cat] expected tensors with at least one dim, found a scalar");
  const int64_t d = normalize_dim(dim, first.dim(), "cat");
  for (const Tensor& x : xs) {
    check_same_dtype("cat", "the first input", first, "another", x);
    check_same_device("cat", "the first input", first, "another", x);
    bool agree = x.dim() == first.dim();
    for (int64_t i = 0; agree && i < x.dim(); ++i) agree = i == d || x.size(i) == first.size(i);
    TS_CHECK(agree, "[cat] expected shapes that agree except in dim ", d, ", found ",
             shape_str(first.shape()), " and ", shape_str(x.shape()));
  }
  if (first.device().is_cuda()) return cuda::cat(xs, d);
  return cpu::cat(xs, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined("split", "x", x);
  TS_CHECK(x.dim() > 0, "[split] expected a tensor with at least one dim, found a scalar");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TS_CHECK(s >= 0, "[split] expected non-negative sizes, found ", shape_str(sizes));
    total += s;
  }
  TS_CHECK(total == x.size(d), "[split] expected sizes summing to ", x.size(d), " (dim ", d, " of ",
           shape_str(x.shape()), "), found ", shape_str(sizes), " summing to ", total);
  // Raw views: kernels never record graphs (Note [Raw views and autograd]).
  NoGradGuard no_grad;
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(x.narrow(d, start, s));
    start += s;
  }
  return pieces;
}

Tensor index_select(const Tensor& x, int64_t dim,
                    const Tensor& index) {  // (..., n, ...), (L) -> (..., L, ...)
  check_defined("index_select", "x", x);
  TS_CHECK(x.dim() > 0, "[index_select] expected a tensor with at least one dim, found a scalar");
  const int64_t d = normalize_dim(dim, x.dim(), "index_select");
  check_index_tensor("index_select", index, x);
  if (x.device().is_cuda()) return cuda::index_select(x, d, index);
  return cpu::index_select(x, d, index);
}

void index_add_(const Tensor& out, int64_t dim, const Tensor& index,
                const Tensor& src) {  // (..., n, ...), (L), (..., L, ...)
  check_defined("index_add_", "out", out);
  check_defined("index_add_", "src", src);
  check_floating("index_add_", "out", out);
  TS_CHECK(out.dim() > 0, "[index_add_] expected out with at least one dim, found a scalar");
  const int64_t d = normalize_dim(dim, out.dim(), "index_add_");
  check_index_tensor("index_add_", index, out);
  check_same_dtype("index_add_", "out", out, "src", src);
  check_same_device("index_add_", "out", out, "src", src);
  Shape want = out.shape();
  want[d] = index.numel();
  check_shape("index_add_", "src", src, want);
  if (out.device().is_cuda()) return cuda::index_add_(out, d, index, src);
  cpu::index_add_(out, d, index, src);
}

}  // namespace tessera::kernels
