// Gradient helpers shared by the op files.
#pragma once

#include "core/tensor.h"

namespace tessera {

// Sums `grad` over the dims that broadcasting added or expanded so it has `shape`
// (the backward of broadcasting). Returns grad itself when the shapes already match.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace tessera
