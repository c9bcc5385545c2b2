// CPU elementwise kernels; inputs are validated by kernels/elementwise.cc.
#pragma once

#include "kernels/elementwise.h"

namespace tessera::kernels::cpu {

Tensor unary(UnaryOp op, const Tensor& x);  // (*) -> (*)
// x or y may be undefined when op' does not read it.
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x,
                      const Tensor& y);                              // (*), (*), (*) -> (*)
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);        // (*a), (*b) -> broadcast
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);      // (*a), (*b) -> broadcast
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // -> broadcast of all 3

}  // namespace tessera::kernels::cpu
