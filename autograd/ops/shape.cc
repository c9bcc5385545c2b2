// Views, joins and gathers: forward and backward side by side.
#include "autograd/ops/shape.h"

#include <numeric>
#include <optional>

#include "autograd/ops/broadcast.h"
#include "autograd/record.h"
#include "core/factories.h"
#include "kernels/index.h"

namespace tessera {
namespace {

// Note [Split gradients without a copy]
// The gradients of split's pieces are often adjacent views of one buffer: cuDNN's attention
// writes dq, dk and dv into one (B, T, 3, H, D) buffer (kernels/cuda/cudnn_attention.cu),
// so the three (B, T, C) gradients GPT's split of its fused qkv projection receives are
// its thirds. Their concatenation is then that buffer itself, seen whole, and split's
// backward returns the view instead of copying (on an H200 the copies were 9% of a GPT-2
// step). A gradient is written in place only once nothing else holds its storage
// (GradSlot in autograd/grad_slot.h), and the pieces are released when split's backward
// returns, so no other tensor sees such a write.

// The pieces (same dtype, strides and shape but along `dim`) seen as one tensor when each
// starts where the previous one ends along `dim` in one storage; nothing otherwise.
std::optional<Tensor> joined_view(const TensorList& parts, int64_t dim) {
  if (parts.empty()) return std::nullopt;
  const Tensor& first = parts.front();
  if (!first.defined() || first.numel() == 0) return std::nullopt;
  Shape shape = first.shape();
  shape[dim] = 0;
  int64_t next_offset = first.storage_offset();
  for (const Tensor& p : parts) {
    if (!p.defined() || p.numel() == 0 || p.storage().data() != first.storage().data() ||
        p.dtype() != first.dtype() || p.strides() != first.strides() ||
        p.storage_offset() != next_offset) {
      return std::nullopt;
    }
    next_offset += p.size(dim) * p.stride(dim);
    shape[dim] += p.size(dim);
  }
  return first.as_strided(shape, first.strides(), first.storage_offset());
}

// Records a view whose gradient is g reshaped back to x's shape.
Tensor reshaping_view(const char* name, const Tensor& x, Tensor out) {
  record_function(name, {x}, {&out}, [shape = x.shape()](const TensorList& g) {
    return TensorList{g[0].reshape(shape)};
  });
  return out;
}

// Records a view of a sub-range of x: the gradient is zeros with g written into the same
// sub-range, which `take` selects from a tensor of x's shape.
template <class Take>
Tensor sub_range_view(const char* name, const Tensor& x, Take take) {
  Tensor out = take(x.detach());
  record_function(name, {x}, {&out}, [shape = x.shape(), take](const TensorList& g) {
    Tensor grad = zeros(shape, {g[0].dtype(), g[0].device()});
    take(grad).copy_(g[0]);
    return TensorList{grad};
  });
  return out;
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  return reshaping_view("reshape", x, x.detach().reshape(shape));
}

Tensor view(const Tensor& x, const Shape& shape) {
  return reshaping_view("view", x, x.detach().view(shape));
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  return reshaping_view("squeeze", x, x.detach().squeeze(dim));
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  return reshaping_view("unsqueeze", x, x.detach().unsqueeze(dim));
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  Tensor out = x.detach().transpose(dim0, dim1);
  record_function("transpose", {x}, {&out}, [dim0, dim1](const TensorList& g) {
    return TensorList{g[0].transpose(dim0, dim1)};
  });
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = x.detach().permute(dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    inverse[normalize_dim(dims[i], x.dim(), "permute")] = static_cast<int64_t>(i);
  }
  record_function("permute", {x}, {&out},
                  [inverse](const TensorList& g) { return TensorList{g[0].permute(inverse)}; });
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor out = x.detach().narrow(dim, start, length);
  const int64_t d = normalize_dim(dim, x.dim(), "narrow");
  // The gradient is g copied into the range and zeros only around it, so each element is
  // written once (the LM head's logits: a (B T, 50257) range of (B T, 50304)).
  record_function("narrow", {x}, {&out},
                  [shape = x.shape(), d, start, length](const TensorList& g) {
                    Tensor grad = empty(shape, {g[0].dtype(), g[0].device()});
                    grad.narrow(d, start, length).copy_(g[0]);
                    const int64_t end = start + length;
                    if (start > 0) grad.narrow(d, 0, start).fill_(0.0);
                    if (end < shape[d]) grad.narrow(d, end, shape[d] - end).fill_(0.0);
                    return TensorList{grad};
                  });
  return out;
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return sub_range_view("slice", x,
                        [=](const Tensor& t) { return t.slice(dim, start, end, step); });
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  return sub_range_view("select", x, [=](const Tensor& t) { return t.select(dim, index); });
}

Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor out = x.detach().expand(shape);
  record_function("expand", {x}, {&out},
                  [in = x.shape()](const TensorList& g) { return TensorList{sum_to(g[0], in)}; });
  return out;
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = x.detach().contiguous();
  record_function("contiguous", {x}, {&out}, [](const TensorList& g) { return TensorList{g[0]}; });
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = x.detach().to(dtype);
  record_function("cast", {x}, {&out},
                  [from = x.dtype()](const TensorList& g) { return TensorList{g[0].to(from)}; });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  Tensor out = kernels::cat(xs, dim);
  std::vector<int64_t> sizes;
  for (const Tensor& t : xs) sizes.push_back(t.size(dim));
  if (!needs_grad(xs)) return out;
  auto node = std::make_shared<FunctionNode>(
      "cat", [sizes, dim](const TensorList& g) { return kernels::split(g[0], sizes, dim); });
  record(node, xs, {&out});
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> outs = kernels::split(x.detach(), sizes, dim);
  if (!needs_grad({&x})) return outs;
  const int64_t d = dim < 0 ? dim + x.dim() : dim;  // kernels::split checked it
  auto node = std::make_shared<FunctionNode>("split", [d](const TensorList& g) {
    if (std::optional<Tensor> whole = joined_view(g, d)) return TensorList{*whole};
    return TensorList{kernels::cat(g, d)};
  });
  record(node, {x}, outs);
  return outs;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = kernels::index_select(x, dim, index);
  record_function("index_select", {x}, {&out},
                  [shape = x.shape(), dim, index = index.detach()](const TensorList& g) {
                    Tensor grad = zeros(shape, {g[0].dtype(), g[0].device()});
                    kernels::index_add_(grad, dim, index, g[0]);
                    return TensorList{grad};
                  });
  return out;
}

}  // namespace tessera
