// Argument checks shared by the kernel families' public entry points. Each throws a
// one-line message led by the op and naming the argument: "[matmul] dtypes differ: a f32
// vs b f64".
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

void check_defined(const char* op, const char* name, const Tensor& t);
// f32 or f64: the dtypes CPU math kernels compute in.
void check_floating(const char* op, const char* name, const Tensor& t);
void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                       const Tensor& b);
void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& shape);
// An optimizer operand: defined, contiguous, with param's dtype, device and shape.
void check_like_param(const char* op, const Tensor& param, const char* name, const Tensor& t);

}  // namespace tessera::kernels
