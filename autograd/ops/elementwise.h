// Differentiable elementwise ops with numpy broadcasting (autograd/ops/elementwise.cc).
#pragma once

#include "core/tensor.h"

namespace tessera {

Tensor add(const Tensor& a, const Tensor& b);  // (*a), (*b) -> broadcast
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);  // a^b elementwise; a > 0 where b is not integral
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation
Tensor sigmoid(const Tensor& x);
// cond ? a : b; cond is a bool tensor (not differentiated), all three broadcast.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// Comparisons (bool results, no gradient).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// A 0-dim tensor of x's dtype and device holding `value`, for mixing scalars into ops.
Tensor scalar_like(const Tensor& x, double value);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
inline Tensor operator*(double a, const Tensor& b) { return mul(scalar_like(b, a), b); }

}  // namespace tessera
