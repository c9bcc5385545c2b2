// Differentiable neural-network ops with fused kernels.
#pragma once

#include <cstdint>
#include <utility>

#include "core/philox.h"
#include "core/tensor.h"

namespace tessera {

Tensor softmax(const Tensor& x);      // over the last dim: (..., V) -> (..., V)
Tensor log_softmax(const Tensor& x);  // over the last dim: (..., V) -> (..., V)

// Normalizes over the last dim; weight and bias (C) may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);  // (..., C) -> (..., C)

// A residual add and the layer norm of its sum as one op: {h = x + delta, layer_norm(h)}
// (Note [Residual layer norm] in kernels/cuda/layer_norm.cu: one pass each way on CUDA;
// the add and the norm's kernels elsewhere, with their bits). x and delta both receive h's
// whole gradient, the norm's part included. (..., C) x2 -> (..., C) x2
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                         const Tensor& bias, double eps = 1e-5);

// Rows of `weight` picked by `ids` (i32|i64; not differentiated).
Tensor embedding(const Tensor& weight, const Tensor& ids);  // (V, C), (...) -> (..., C)

// Mean softmax cross-entropy over rows whose target != ignore_index. With classes < C
// (default: all C) only logits' first `classes` columns are classes (a padded vocabulary):
// the rest are ignored and get zero gradient, without a narrowed copy in either direction.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     int64_t classes = -1);  // (N, C), (N) -> ()

// Zeroes each element with probability p and scales the rest by 1/(1-p); the mask comes
// from `gen` (advanced) and is regenerated, not stored, for backward. Identity when
// !training or p == 0.
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training = true);

// Causal scaled dot-product attention; scale defaults to 1/sqrt(D) when <= 0.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        double scale = 0.0);  // (B, H, T, D) x3 -> (B, H, T, D)
// The same with its probabilities P dropped out: equal to
// matmul(dropout(P, p, gen, training), v) up to rounding, with the same mask from the same
// draw of `gen` (B H T T values reserved), and no (B, H, T, T) tensor kept for backward
// (cuDNN's graphs take a transient 16-bit mask: Note [Attention-probability dropout] in
// kernels/attention.h). (B, H, T, D) x3 -> (B, H, T, D)
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double p, Generator& gen,
                        bool training = true, double scale = 0.0);

}  // namespace tessera
