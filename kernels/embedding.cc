// Validation and the device switch of the embedding family.
#include "kernels/embedding.h"

#include "kernels/checks.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

void check_ids(const char* op, const Tensor& ids) {
  check_defined(op, "ids", ids);
  TS_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64, "[", op,
           "] expected ids of dtype i32 or i64, found ", dtype_name(ids.dtype()), " ",
           shape_str(ids.shape()));
}

// grad (..., C) of a floating dtype for ids (...) on the same device.
void check_grad_and_ids(const char* op, const Tensor& grad, const Tensor& ids) {
  check_defined(op, "grad", grad);
  check_floating(op, "grad", grad);
  check_ids(op, ids);
  check_same_device(op, "grad", grad, "ids", ids);
  Shape want = ids.shape();
  want.push_back(grad.dim() > 0 ? grad.shape().back() : 0);
  TS_CHECK(grad.dim() == ids.dim() + 1 && grad.shape() == want, "[", op,
           "] expected grad of shape ids + (C), found grad ", shape_str(grad.shape()), " for ids ",
           shape_str(ids.shape()));
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {  // (V, C), (...) -> (..., C)
  check_defined("embedding", "weight", weight);
  check_ids("embedding", ids);
  TS_CHECK(weight.dim() == 2, "[embedding] expected a 2-D weight (V, C), found ",
           shape_str(weight.shape()));
  check_same_device("embedding", "weight", weight, "ids", ids);
  if (weight.device().is_cuda()) return cuda::embedding(weight, ids);
  return cpu::embedding(weight, ids);
}

Tensor embedding_backward(const Tensor& grad, const Tensor& ids,
                          int64_t num_embeddings) {  // (..., C), (...) -> (V, C)
  check_grad_and_ids("embedding_backward", grad, ids);
  TS_CHECK(num_embeddings >= 0, "[embedding_backward] expected num_embeddings >= 0, found ",
           num_embeddings);
  if (grad.device().is_cuda()) return cuda::embedding_backward(grad, ids, num_embeddings);
  return cpu::embedding_backward(grad, ids, num_embeddings);
}

void embedding_backward_add_(const Tensor& dweight, const Tensor& grad,
                             const Tensor& ids) {  // (V, C) += (..., C) by (...)
  const char* op = "embedding_backward_add_";
  check_grad_and_ids(op, grad, ids);
  check_defined(op, "dweight", dweight);
  check_same_device(op, "dweight", dweight, "grad", grad);
  TS_CHECK(dweight.dim() == 2 && dweight.is_contiguous() && dweight.dtype() == grad.dtype() &&
               dweight.size(1) == grad.shape().back(),
           "[", op, "] expected a contiguous (V, ", grad.shape().back(), ") dweight of dtype ",
           dtype_name(grad.dtype()), ", found ", dweight.str());
  if (grad.device().is_cuda()) {
    cuda::embedding_backward_add_(dweight, grad, ids);
  } else {
    cpu::embedding_backward_add_(dweight, grad, ids);
  }
}

}  // namespace tessera::kernels
