// Validation and the device switch of layer normalization.
#include "kernels/layer_norm.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cuda/kernels.h"
#include "kernels/elementwise.h"

namespace tessera::kernels {
namespace {

// x is a floating (..., C) tensor; a defined `t` is a (C) tensor of x's dtype and device.
void check_x_and_param(const char* op, const Tensor& x, const char* name, const Tensor& t) {
  if (!t.defined()) return;
  check_same_dtype(op, "x", x, name, t);
  check_same_device(op, "x", x, name, t);
  check_shape(op, name, t, {x.size(-1)});
}

// The row statistics are (...) tensors of stat_dtype(x) on x's device.
void check_stat(const char* op, const Tensor& x, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  check_stat_dtype(op, "x", x, name, t);
  check_same_device(op, "x", x, name, t);
  check_shape(op, name, t, Shape(x.shape().begin(), x.shape().end() - 1));
}

void check_x(const char* op, const Tensor& x) {  // (..., C)
  check_defined(op, "x", x);
  check_floating(op, "x", x);
  TS_CHECK(x.dim() >= 1, "[", op, "] expected x with at least 1 dim, found ", shape_str(x.shape()));
}

// layer_norm's operands, errors naming `op`.
void check_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                   double eps) {
  check_x(op, x);
  check_x_and_param(op, x, "weight", weight);
  check_x_and_param(op, x, "bias", bias);
  TS_CHECK(weight.defined() || !bias.defined(), "[", op,
           "] expected a weight with the bias, found a bias without weight");
  TS_CHECK(std::isfinite(eps) && eps >= 0, "[", op, "] expected eps >= 0, found ", eps);
}

// layer_norm_backward's operands, errors naming `op`.
void check_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                    const Tensor& mean, const Tensor& rstd) {
  check_x(op, x);
  check_defined(op, "dy", dy);
  check_same_dtype(op, "x", x, "dy", dy);
  check_same_device(op, "x", x, "dy", dy);
  check_same_shape(op, "x", x, "dy", dy);
  check_x_and_param(op, x, "weight", weight);
  check_stat(op, x, "mean", mean);
  check_stat(op, x, "rstd", rstd);
}

}  // namespace

LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  constexpr const char* op = "layer_norm";
  check_forward(op, x, weight, bias, eps);
  if (x.device().is_cuda()) return cuda::layer_norm(x, weight, bias, eps);
  return cpu::layer_norm(x, weight, bias, eps);
}

LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd) {
  constexpr const char* op = "layer_norm_backward";
  check_backward(op, dy, x, weight, mean, rstd);
  if (x.device().is_cuda()) return cuda::layer_norm_backward(dy, x, weight, mean, rstd);
  return cpu::layer_norm_backward(dy, x, weight, mean, rstd);
}

AddLayerNormOutput add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                  const Tensor& bias, double eps) {
  constexpr const char* op = "add_layer_norm";
  check_x(op, x);
  check_defined(op, "delta", delta);
  check_same_dtype(op, "x", x, "delta", delta);
  check_same_device(op, "x", x, "delta", delta);
  check_same_shape(op, "x", x, "delta", delta);
  if (x.device().is_cuda()) {
    check_forward(op, x, weight, bias, eps);
    return cuda::add_layer_norm(x, delta, weight, bias, eps);
  }
  const Tensor h = binary(BinaryOp::add, x, delta);
  return {h, layer_norm(h, weight, bias, eps)};
}

LayerNormGrads add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                                       const Tensor& weight, const Tensor& mean,
                                       const Tensor& rstd) {
  constexpr const char* op = "add_layer_norm_backward";
  check_defined(op, "h", h);
  check_defined(op, "dh", dh);
  check_same_dtype(op, "h", h, "dh", dh);
  check_same_device(op, "h", h, "dh", dh);
  check_same_shape(op, "h", h, "dh", dh);
  if (h.device().is_cuda()) {
    check_backward(op, dy, h, weight, mean, rstd);
    return cuda::add_layer_norm_backward(dy, dh, h, weight, mean, rstd);
  }
  LayerNormGrads g = layer_norm_backward(dy, h, weight, mean, rstd);
  g.dx = binary(BinaryOp::add, dh, g.dx);
  return g;
}

}  // namespace tessera::kernels
