// Causal scaled dot-product attention, flash-style: no (T, T) matrix is kept.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

// Note [Attention-probability dropout]
// With dropout the output is (P * M / (1 - p)) v, P the causal softmax and M the mask that
// kernels::dropout (kernels/dropout.h) draws for a contiguous (B, H, T, T) tensor of those
// probabilities under the same (p, seed, offset): probability (b, h, i, j) has the
// row-major index idx = ((b H + h) T + i) T + j and is kept when uniform(word idx % 4 of
// Philox block offset + idx / 4) >= p (p rounded to float). So the fused kernels drop
// exactly what dropout(softmax(scores)) drops, and a caller reserves B H T T values of its
// generator, as for that tensor. lse stays the log-sum-exp of the undropped scores. The
// backward regenerates M (as dropout_backward does):
//   dv = (P * M / (1 - p))^T dout,  dP = (dout v^T) * M / (1 - p),
//   dS = P * (dP - rowsum(dout * out)),
// the row sum of P * dP being dout . out with dropout too. Each kernel makes the words of
// the probabilities its tile holds, so no mask is stored (cuDNN's graph takes the mask as
// a tensor instead: Note [cuDNN attention graphs] in kernels/cuda/cudnn_attention.cu).
struct AttentionDropout {
  double p = 0.0;  // in [0, 1); 0: nothing is dropped
  uint64_t seed = 0;
  uint64_t offset = 0;  // Philox block of the mask's element 0

  bool drops() const { return p > 0.0; }
};

struct AttentionOutput {
  Tensor out;  // (B, H, T, D)
  Tensor lse;  // (B, H, T) log-sum-exp of each scaled, masked score row; f32 for f16/bf16
};

// out[t] = sum_{s <= t} softmax_s(scale * q[t] . k[s]) v[s], the probabilities dropped
// out as Note [Attention-probability dropout] says.
AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 const AttentionDropout& dropout = {});  // (B, H, T, D) x3

struct AttentionGrads {
  Tensor dq, dk, dv;  // (B, H, T, D)
};

// Recomputes the probabilities from q, k and lse, and the mask from `dropout` (the
// forward's).
AttentionGrads causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         double scale, const AttentionDropout& dropout = {});

}  // namespace tessera::kernels
