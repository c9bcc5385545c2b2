// Elementwise ops: forward and backward side by side.
#include "autograd/ops/elementwise.h"

#include "autograd/ops/broadcast.h"
#include "autograd/record.h"
#include "core/factories.h"
#include "kernels/elementwise.h"

namespace tessera {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

Tensor bin(BinaryOp op, const Tensor& a, const Tensor& b) { return kernels::binary(op, a, b); }

Tensor unary_op(UnaryOp op, const Tensor& x) {
  Tensor y = kernels::unary(op, x);
  record_function(kernels::unary_name(op), {x}, {&y},
                  [op, x = x.detach(), y = y.detach()](const TensorList& g) -> TensorList {
                    return {kernels::unary_backward(op, g[0], x, y)};
                  });
  return y;
}

Tensor compare_op(kernels::CompareOp op, const Tensor& a, const Tensor& b) {
  return kernels::compare(op, a.detach(), b.detach());
}

}  // namespace

Tensor scalar_like(const Tensor& x, double value) {
  return full({}, value, {x.dtype(), x.device()});
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::add, a, b);
  record_function("add", {a, b}, {&out},
                  [sa = a.shape(), sb = b.shape()](const TensorList& g) -> TensorList {
                    return {sum_to(g[0], sa), sum_to(g[0], sb)};
                  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::sub, a, b);
  record_function("sub", {a, b}, {&out},
                  [sa = a.shape(), sb = b.shape()](const TensorList& g) -> TensorList {
                    return {sum_to(g[0], sa), sum_to(kernels::unary(UnaryOp::neg, g[0]), sb)};
                  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::mul, a, b);
  record_function("mul", {a, b}, {&out},
                  [a = a.detach(), b = b.detach(), ra = a.requires_grad(),
                   rb = b.requires_grad()](const TensorList& g) -> TensorList {
                    return {ra ? sum_to(bin(BinaryOp::mul, g[0], b), a.shape()) : Tensor(),
                            rb ? sum_to(bin(BinaryOp::mul, g[0], a), b.shape()) : Tensor()};
                  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::div, a, b);
  record_function("div", {a, b}, {&out},
                  [a = a.detach(), b = b.detach(), out = out.detach(),
                   rb = b.requires_grad()](const TensorList& g) -> TensorList {
                    // d/da = 1/b; d/db = -a/b^2 = -out/b.
                    Tensor ga = bin(BinaryOp::div, g[0], b);
                    Tensor gb =
                        rb ? kernels::unary(UnaryOp::neg, bin(BinaryOp::mul, ga, out)) : Tensor();
                    return {sum_to(ga, a.shape()), rb ? sum_to(gb, b.shape()) : Tensor()};
                  });
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = bin(BinaryOp::pow, a, b);
  record_function("pow", {a, b}, {&out},
                  [a = a.detach(), b = b.detach(), out = out.detach(),
                   rb = b.requires_grad()](const TensorList& g) -> TensorList {
                    // d/da = b a^(b-1); d/db = out ln(a).
                    Tensor one = scalar_like(b, 1.0);
                    Tensor da =
                        bin(BinaryOp::mul, b, bin(BinaryOp::pow, a, bin(BinaryOp::sub, b, one)));
                    Tensor ga = sum_to(bin(BinaryOp::mul, g[0], da), a.shape());
                    if (!rb) return {ga, Tensor()};
                    Tensor db = bin(BinaryOp::mul, out, kernels::unary(UnaryOp::log, a));
                    return {ga, sum_to(bin(BinaryOp::mul, g[0], db), b.shape())};
                  });
  return out;
}

Tensor pow(const Tensor& a, double exponent) { return pow(a, scalar_like(a, exponent)); }

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::tanh, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::relu, x); }
Tensor gelu(const Tensor& x) { return unary_op(UnaryOp::gelu, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::sigmoid, x); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::where(cond, a, b);
  record_function("where", {a, b}, {&out},
                  [cond = cond.detach(), sa = a.shape(), sb = b.shape()](const TensorList& g) {
                    Tensor zero = scalar_like(g[0], 0.0);
                    return TensorList{sum_to(kernels::where(cond, g[0], zero), sa),
                                      sum_to(kernels::where(cond, zero, g[0]), sb)};
                  });
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return compare_op(kernels::CompareOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare_op(kernels::CompareOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_op(kernels::CompareOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare_op(kernels::CompareOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_op(kernels::CompareOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_op(kernels::CompareOp::ge, a, b); }

}  // namespace tessera
