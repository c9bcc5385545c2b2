// Elementwise kernels: unary math, broadcasting binary ops, comparisons and where.
//
// Inputs may be any layout (non-contiguous, expanded); outputs are new contiguous
// tensors. Math ops compute in f32 or f64; both operands of a binary op share a dtype.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

enum class UnaryOp : uint8_t { neg, exp, log, sqrt, rsqrt, tanh, relu, gelu, sigmoid };

// Name used in messages: "exp", "gelu", ...
const char* unary_name(UnaryOp op);

// y = op(x); gelu is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor unary(UnaryOp op, const Tensor& x);  // (*) -> (*)
// grad * op'(x), using the forward input x and output y (whichever is cheaper).
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x,
                      const Tensor& y);  // (*), (*), (*) -> (*)

enum class BinaryOp : uint8_t { add, sub, mul, div, pow, maximum, minimum };
const char* binary_name(BinaryOp op);

// out = op(a, b) with numpy broadcasting; a and b share a floating dtype and device.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);  // (*a), (*b) -> broadcast(a, b)

enum class CompareOp : uint8_t { eq, ne, lt, le, gt, ge };
const char* compare_name(CompareOp op);

// Boolean out = a op b with broadcasting; any equal dtypes.
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);

// out = cond ? a : b with three-way broadcasting; cond is bool, a and b share a dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

}  // namespace tessera::kernels
