// Argument checks shared by the kernel families' public entry points. Each throws a
// one-line message led by the op and naming the argument: "[matmul] dtypes differ: a f32
// vs b f64".
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

void check_defined(const char* op, const char* name, const Tensor& t);
// A dtype math kernels compute in: f32, f64, f16 or bf16 (16-bit math accumulates in f32 on
// both backends: Note [16-bit math on the CPU] in kernels/cpu/widen.h).
void check_floating(const char* op, const char* name, const Tensor& t);
void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                       const Tensor& b);
void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& shape);

// An operand as kernels read it: t without autograd state, made contiguous (copied only when
// it is not); undefined stays so.
Tensor contiguous_or_undefined(const Tensor& t);
// The dtype of row statistics and losses computed from x (layer-norm mean/rstd, softmax
// log-sum-exp, the cross-entropy loss): f32 for f16/bf16 inputs, x's dtype otherwise.
DType stat_dtype(DType x);
// `t` (a statistic of `x`) has stat_dtype(x.dtype()).
void check_stat_dtype(const char* op, const char* name_x, const Tensor& x, const char* name,
                      const Tensor& t);
// An optimizer operand: defined, contiguous, with param's dtype, device and shape.
void check_like_param(const char* op, const Tensor& param, const char* name, const Tensor& t);

}  // namespace tessera::kernels
