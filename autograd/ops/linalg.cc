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

// Adds those gradients into their slots (null where not wanted): the weight's as a GEMM
// with beta = 1 into its leaf's buffer where the slot allows (Note [Gradients accumulated
// into leaves] in autograd/grad_slot.h).
void add_param_grads(const Tensor& g, const Tensor& x, GradSlot* weight, GradSlot* bias) {
  if (weight != nullptr) {
    if (Tensor* sum = weight->in_place({g.size(1), x.size(1)}, g.dtype(), g.device())) {
      const Tensor dbias = kernels::add_linear_param_grads(g, x, *sum, bias != nullptr);
      if (bias != nullptr) bias->add(dbias);
      return;
    }
  }
  if (weight == nullptr && bias == nullptr) return;
  const kernels::LinearParamGrads p = param_grads(g, x, weight != nullptr, bias != nullptr);
  if (weight != nullptr) weight->add(p.dweight);
  if (bias != nullptr) bias->add(p.dbias);
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
  record_function("linear", {x, weight, bias}, {&y},
                  [x = x.detach(), w = weight.detach(), reduce_input_grad](
                      const TensorList& g, const std::vector<GradSlot*>& slots) {
                    if (slots[0] != nullptr) {
                      const Tensor dx = kernels::matmul(g[0], w);  // (..., in)
                      if (reduce_input_grad) reduce_input_grad(dx);
                      slots[0]->add(dx);
                    }
                    add_param_grads(rows_of(g[0]), rows_of(x), slots[1],
                                    slots[2]);  // (out, in), (out)
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
  record_function("dense_gelu_dense", {x, w1, b1, w2, b2}, {&z},
                  [x2, w1 = w1.detach(), w2 = w2.detach(), pre = std::move(first.pre),
                   h = std::move(first.y), shape = x.shape(),
                   reduce_input_grad](const TensorList& g, const std::vector<GradSlot*>& slots) {
                    // slots: x, w1, b1, w2, b2 (null where no gradient is wanted).
                    const Tensor dz = rows_of(g[0]);  // (R, out)
                    // x's gradient first, so that its reduction travels under the weights'
                    // products.
                    kernels::GeluInputGrads d;
                    if (slots[0] || slots[1] || slots[2]) {
                      d = kernels::gelu_input_grads(dz, w2, pre);  // (R, hidden)
                    }
                    if (slots[0] != nullptr) {
                      const Tensor dx = kernels::matmul(d.dpre, w1).reshape(shape);  // (..., in)
                      if (reduce_input_grad) reduce_input_grad(dx);
                      slots[0]->add(dx);
                    }
                    add_param_grads(dz, h, slots[3], slots[4]);       // (out, hidden), (out)
                    add_param_grads(d.dpre, x2, slots[1], nullptr);   // (hidden, in)
                    if (slots[2] != nullptr) slots[2]->add(d.dbias);  // (hidden)
                  });
  return z;
}

}  // namespace tessera
