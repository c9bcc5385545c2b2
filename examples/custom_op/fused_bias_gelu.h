// A user-defined op, written outside the framework's folders: y = gelu(x + bias), fused
// into one pass with its own CPU kernel and backward node. It is what a user does to add
// a kernel to Tessera: subclass Node, write the kernel, record the node; no framework edit.
#pragma once

#include "core/tensor.h"

namespace example {

// (..., C), (C) -> (..., C); f32 or f64 CPU tensors.
tessera::Tensor fused_bias_gelu(const tessera::Tensor& x, const tessera::Tensor& bias);

}  // namespace example
