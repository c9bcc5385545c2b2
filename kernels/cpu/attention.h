// CPU causal attention, one query row at a time (see kernels/attention.h).
#pragma once

#include "kernels/attention.h"

namespace tessera::kernels::cpu {

AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 const AttentionDropout& dropout);  // (B, H, T, D) x3
// dout, q, k, v, out: (B, H, T, D); lse: (B, H, T).
AttentionGrads causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         double scale, const AttentionDropout& dropout);

}  // namespace tessera::kernels::cpu
