#include "kernels/matmul.h"

#include "kernels/blas1.h"
#include "kernels/checks.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/kernels.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace tessera::kernels {

namespace {

// op(a) @ op(b) is defined: errors name `op`.
void check_operands(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                    const char* op = "matmul") {
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  check_floating(op, "a", a);
  check_same_dtype(op, "a", a, "b", b);
  check_same_device(op, "a", a, "b", b);
  TS_CHECK(a.dim() >= 2, "[", op, "] expected a with at least 2 dims, found ",
           shape_str(a.shape()));
  TS_CHECK(b.dim() == 2 || b.dim() == a.dim(), "[", op, "] expected b with 2 dims or as many as a ",
           shape_str(a.shape()), ", found ", shape_str(b.shape()));
  if (b.dim() > 2) {
    const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
    const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
    TS_CHECK(a_batch == b_batch, "[", op, "] batch dimensions differ: ", shape_str(a.shape()),
             " vs ", shape_str(b.shape()));
  }
  const int64_t k_a = trans_a ? a.size(-2) : a.size(-1);
  const int64_t k_b = trans_b ? b.size(-1) : b.size(-2);
  TS_CHECK(k_a == k_b, "[", op, "] inner dimensions differ: ", shape_str(a.shape()), " vs ",
           shape_str(b.shape()), trans_a ? " (trans_a)" : "", trans_b ? " (trans_b)" : "");
}

// An undefined bias, or one of x's dtype and device with one entry per row of weight.
void check_bias(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (!bias.defined()) return;
  check_same_dtype(op, "x", x, "bias", bias);
  check_same_device(op, "x", x, "bias", bias);
  TS_CHECK(bias.shape() == Shape{weight.size(0)}, "[", op, "] expected bias of shape (",
           weight.size(0), "), found ", shape_str(bias.shape()));
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_operands(a, b, trans_a, trans_b);
  if (a.device().is_cuda()) return cuda::matmul(a, b, trans_a, trans_b, Tensor());
  return cpu::matmul(a, b, trans_a, trans_b);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TS_CHECK(weight.dim() == 2, "[linear] expected a 2-D weight (out, in), found shape ",
           shape_str(weight.shape()));
  check_operands(x, weight, false, true);
  check_bias("linear", x, weight, bias);
  if (x.device().is_cuda()) return cuda::matmul(x, weight, false, true, bias);
  return cpu::matmul(x, weight, false, true, bias);
}

namespace {

// The operands of a linear layer's parameter gradients: g (R, N) and x (R, K).
void check_param_grad_operands(const char* op, const Tensor& g, const Tensor& x) {
  check_defined(op, "g", g);
  check_defined(op, "x", x);
  TS_CHECK(g.dim() == 2 && x.dim() == 2 && g.size(0) == x.size(0), "[", op,
           "] expected g (R, N) and x (R, K) with the same rows, found ", shape_str(g.shape()),
           " and ", shape_str(x.shape()));
  check_operands(g, x, true, false, op);
}

}  // namespace

LinearParamGrads linear_param_grads(const Tensor& g, const Tensor& x) {
  check_param_grad_operands("linear_param_grads", g, x);
  if (g.device().is_cuda()) return cuda::linear_param_grads(g, x);
  return {cpu::matmul(g, x, true, false), sum(g, {0}, false)};
}

Tensor add_linear_param_grads(const Tensor& g, const Tensor& x, const Tensor& dweight,
                              bool with_bias) {
  constexpr const char* op = "add_linear_param_grads";
  check_param_grad_operands(op, g, x);
  check_defined(op, "dweight", dweight);
  TS_CHECK(dweight.shape() == Shape({g.size(1), x.size(1)}) && dweight.dtype() == g.dtype() &&
               dweight.device() == g.device() && dweight.is_contiguous(),
           "[", op, "] expected dweight a contiguous ", dtype_name(g.dtype()), " (", g.size(1),
           ", ", x.size(1), ") tensor on ", g.device().str(), ", found ", dweight.str());
  if (g.device().is_cuda()) return cuda::add_linear_param_grads(g, x, dweight, with_bias);
  axpy_(dweight, cpu::matmul(g, x, true, false));
  return with_bias ? sum(g, {0}, false) : Tensor();
}

LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr const char* op = "linear_gelu";
  TS_CHECK(x.dim() == 2 && weight.dim() == 2, "[", op,
           "] expected x (R, K) and weight (N, K), found ", shape_str(x.shape()), " and ",
           shape_str(weight.shape()));
  if (x.device().is_cuda()) {
    check_operands(x, weight, false, true, op);
    check_bias(op, x, weight, bias);
    return cuda::linear_gelu(x, weight, bias);
  }
  Tensor pre = linear(x, weight, bias);
  return {unary(UnaryOp::gelu, pre), pre};
}

GeluInputGrads gelu_input_grads(const Tensor& g, const Tensor& weight, const Tensor& pre) {
  constexpr const char* op = "gelu_input_grads";
  TS_CHECK(g.dim() == 2 && weight.dim() == 2 && pre.dim() == 2 && g.size(0) == pre.size(0) &&
               pre.size(1) == weight.size(1),
           "[", op, "] expected g (R, N), weight (N, K) and pre (R, K), found ",
           shape_str(g.shape()), ", ", shape_str(weight.shape()), " and ", shape_str(pre.shape()));
  check_operands(g, weight, false, false, op);
  check_same_dtype(op, "g", g, "pre", pre);
  check_same_device(op, "g", g, "pre", pre);
  if (g.device().is_cuda()) return cuda::gelu_input_grads(g, weight, pre);
  const Tensor dpre =
      unary_backward(UnaryOp::gelu, cpu::matmul(g, weight, false, false), pre, Tensor());
  return {dpre, sum(dpre, {0}, false)};
}

}  // namespace tessera::kernels
