// The one list of differentiable ops. tests/autograd/gradcheck_test.cc fails when an op
// named here has no gradcheck case (and, once CUDA kernels exist, no CUDA parity case).
#pragma once

#include <array>
#include <string_view>

namespace tessera {

inline constexpr std::array<std::string_view, 48> kDifferentiableOps = {
    // elementwise (autograd/ops/elementwise.h)
    "add", "sub", "mul", "div", "pow", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "relu", "gelu",
    "sigmoid", "where",
    // reductions (autograd/ops/reduce.h)
    "sum", "mean", "var", "max",
    // matrix products (autograd/ops/linalg.h)
    "matmul", "linear", "dense_gelu_dense",
    // neural-network ops (autograd/ops/nn.h)
    "softmax", "log_softmax", "layer_norm", "add_layer_norm", "embedding", "cross_entropy",
    "dropout", "causal_attention",
    // block-sparse attention (autograd/ops/block_sparse.h)
    "sdd_matmul", "sparse_softmax", "dsd_matmul",
    // views, joins and gathers (autograd/ops/shape.h)
    "reshape", "view", "transpose", "permute", "narrow", "slice", "select", "expand", "squeeze",
    "unsqueeze", "contiguous", "cast", "cat", "split", "index_select"};

}  // namespace tessera
