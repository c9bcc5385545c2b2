// Reverse-mode differentiation over the recorded graph.
#pragma once

#include "autograd/node.h"

namespace tessera {

// Accumulates d(roots)/d(leaf) into every leaf that requires grad and is reachable.
// `grad_roots` seeds each root's gradient; an empty list (or an undefined entry) means
// ones, allowed only for one-element roots. Unless `retain_graph`, the saved tensors are
// freed as the walk passes them, and a second backward through them is an error.
void backward(const TensorList& roots, const TensorList& grad_roots = {},
              bool retain_graph = false);
void backward(const Tensor& root, const Tensor& grad_root = {}, bool retain_graph = false);

}  // namespace tessera
