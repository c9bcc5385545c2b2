// Matrix products: forward and backward side by side.
#include "autograd/ops/linalg.h"

#include "autograd/record.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"

namespace tessera {
namespace {

// All leading dims folded into rows: (..., C) -> (R, C).
Tensor rows_of(const Tensor& t) { return t.reshape({-1, t.size(-1)}); }

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::matmul(a, b);
  record_function("matmul", {a, b}, {&out},
                  [a = a.detach(), b = b.detach(), ra = a.requires_grad(),
                   rb = b.requires_grad()](const TensorList& g) -> TensorList {
                    Tensor da =
                        ra ? kernels::matmul(g[0], b, false, true) : Tensor();  // (..., M, K)
                    Tensor db;
                    if (rb) {
                      db = b.dim() == 2 && a.dim() > 2
                               ? kernels::matmul(rows_of(a), rows_of(g[0]), true, false)  // (K, N)
                               : kernels::matmul(a, g[0], true, false);  // (..., K, N)
                    }
                    return {da, db};
                  });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const StartGradReduction& reduce_input_grad) {
  TS_CHECK(weight.dim() == 2, "[linear] expected a 2-D weight (out, in), found shape ",
           shape_str(weight.shape()));
  TS_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1),
           "[linear] input features differ: ", shape_str(x.shape()), " vs weight ",
           shape_str(weight.shape()));
  Tensor y = kernels::linear(x, weight, bias);  // the bias fused into the GEMM on CUDA
  record_function(
      "linear", {x, weight, bias}, {&y},
      [x = x.detach(), w = weight.detach(), rx = x.requires_grad(), rw = weight.requires_grad(),
       has_bias = bias.defined(), reduce_input_grad](const TensorList& g) -> TensorList {
        Tensor dx = rx ? kernels::matmul(g[0], w) : Tensor();  // (..., in)
        if (dx.defined() && reduce_input_grad) reduce_input_grad(dx);
        Tensor dw, db;
        if (rw && has_bias) {  // one pass over g on CUDA (kernels/matmul.h)
          kernels::LinearParamGrads p = kernels::linear_param_grads(rows_of(g[0]), rows_of(x));
          dw = std::move(p.dweight);  // (out, in)
          db = std::move(p.dbias);    // (out)
        } else {
          if (rw) dw = kernels::matmul(rows_of(g[0]), rows_of(x), true, false);  // (out, in)
          if (has_bias) db = kernels::sum(rows_of(g[0]), {0}, false);
        }
        return {dx, dw, db};
      });
  return y;
}

}  // namespace tessera
