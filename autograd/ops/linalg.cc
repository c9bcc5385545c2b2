// Matrix products: forward and backward side by side.
#include "autograd/ops/linalg.h"

#include "autograd/record.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"

namespace tessera {
namespace {

// All leading dims folded into rows: (..., C) -> (R, C).
Tensor rows_of(const Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// A linear layer's weight gradient (when `weight`) and bias gradient (when `bias`) from its
// output gradient g (R, out) and input x (R, in): one pass over g on CUDA when both are
// wanted (kernels/matmul.h). -> (out, in), (out); undefined where not wanted
kernels::LinearParamGrads param_grads(const Tensor& g, const Tensor& x, bool weight, bool bias) {
  if (weight && bias) return kernels::linear_param_grads(g, x);
  return {weight ? kernels::matmul(g, x, true, false) : Tensor(),
          bias ? kernels::sum(g, {0}, false) : Tensor()};
}

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
        if (!rw && !has_bias) return {dx, Tensor(), Tensor()};
        kernels::LinearParamGrads p = param_grads(rows_of(g[0]), rows_of(x), rw, has_bias);
        return {dx, p.dweight, p.dbias};
      });
  return y;
}

Tensor dense_gelu_dense(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                        const Tensor& b2, const StartGradReduction& reduce_input_grad) {
  TS_CHECK(x.dim() >= 1 && w1.dim() == 2 && w2.dim() == 2 && x.size(-1) == w1.size(1) &&
               w2.size(1) == w1.size(0),
           "[dense_gelu_dense] expected x (..., in), w1 (hidden, in) and w2 (out, hidden), found ",
           shape_str(x.shape()), ", ", shape_str(w1.shape()), " and ", shape_str(w2.shape()));
  const Tensor x2 = rows_of(x.detach());  // (R, in)
  kernels::LinearGelu first =
      kernels::linear_gelu(x2, w1.detach(),
                           b1.defined() ? b1.detach() : Tensor());  // (R, hidden)
  Shape out_shape = x.shape();
  out_shape.back() = w2.size(0);
  Tensor z = kernels::linear(first.y, w2.detach(), b2.defined() ? b2.detach() : Tensor())
                 .reshape(out_shape);  // (..., out)
  record_function(
      "dense_gelu_dense", {x, w1, b1, w2, b2}, {&z},
      [x2, w1 = w1.detach(), w2 = w2.detach(), pre = std::move(first.pre), h = std::move(first.y),
       shape = x.shape(), rx = x.requires_grad(), r1 = w1.requires_grad(),
       rb1 = b1.defined() && b1.requires_grad(), r2 = w2.requires_grad(),
       rb2 = b2.defined() && b2.requires_grad(),
       reduce_input_grad](const TensorList& g) -> TensorList {
        const Tensor dz = rows_of(g[0]);  // (R, out)
        // x's gradient first, so that its reduction travels under the weights'
        // products.
        kernels::GeluInputGrads d;
        if (rx || r1 || rb1) d = kernels::gelu_input_grads(dz, w2, pre);  // (R, hidden)
        Tensor dx;
        if (rx) {
          dx = kernels::matmul(d.dpre, w1).reshape(shape);  // (..., in)
          if (reduce_input_grad) reduce_input_grad(dx);
        }
        kernels::LinearParamGrads second = param_grads(dz, h, r2, rb2);  // (out, hidden), (out)
        Tensor dw1 = r1 ? kernels::matmul(d.dpre, x2, true, false) : Tensor();  // (hidden, in)
        return {dx, dw1, rb1 ? d.dbias : Tensor(), second.dweight, second.dbias};
      });
  return z;
}

}  // namespace tessera
