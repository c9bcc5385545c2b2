// Causal scaled dot-product attention, flash-style: no (T, T) matrix is kept.
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

struct AttentionOutput {
  Tensor out;  // (B, H, T, D)
  Tensor lse;  // (B, H, T) log-sum-exp of each scaled, masked score row; f32 for f16/bf16
};

// out[t] = sum_{s <= t} softmax_s(scale * q[t] . k[s]) v[s].
AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                 double scale);  // (B, H, T, D) x3

struct AttentionGrads {
  Tensor dq, dk, dv;  // (B, H, T, D)
};

// Recomputes the probabilities from q, k and lse.
AttentionGrads causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         double scale);

}  // namespace tessera::kernels
