// Gradient checking against f64 central differences.
#pragma once

#include <functional>
#include <string>

#include "autograd/node.h"

namespace tessera {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-6;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-4;
  uint64_t seed = 1234;  // for the random output cotangent
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, analytic and numeric values
};

// Checks the gradients of fn at `inputs` (f64 leaves; those that require grad are
// checked, and may be non-contiguous views). With a random cotangent w, it compares the
// backward of sum(fn(inputs) * w) against central differences of the same scalar,
// element by element.
GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& fn,
                          const TensorList& inputs, const GradcheckOptions& options = {});

}  // namespace tessera
