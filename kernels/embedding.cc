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
  check_defined("embedding_backward", "grad", grad);
  check_floating("embedding_backward", "grad", grad);
  check_ids("embedding_backward", ids);
  check_same_device("embedding_backward", "grad", grad, "ids", ids);
  TS_CHECK(num_embeddings >= 0, "[embedding_backward] expected num_embeddings >= 0, found ",
           num_embeddings);
  Shape want = ids.shape();
  want.push_back(grad.dim() > 0 ? grad.shape().back() : 0);
  TS_CHECK(grad.dim() == ids.dim() + 1 && grad.shape() == want,
           "[embedding_backward] expected grad of shape ids + (C), found grad ",
           shape_str(grad.shape()), " for ids ", shape_str(ids.shape()));
  if (grad.device().is_cuda()) return cuda::embedding_backward(grad, ids, num_embeddings);
  return cpu::embedding_backward(grad, ids, num_embeddings);
}

}  // namespace tessera::kernels
