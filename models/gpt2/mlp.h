// GPT-2 feed-forward block: C -> 4C, GELU (tanh approximation), 4C -> C.
#pragma once

#include "autograd/module.h"
#include "models/gpt2/config.h"
#include "models/layers/dropout.h"
#include "parallel/comm/communicator.h"
#include "parallel/tensor/layers.h"

namespace tessera {

// Whether GPT's fused ops take activations x: on CUDA in 16 bits, where their fusions are
// (Notes [Fused tensor-parallel MLP] in parallel/tensor/layers.h and [Residual layer norm]
// in kernels/cuda/layer_norm.cu); on the CPU they would run their parts' kernels anyway.
bool takes_fused_ops(const Tensor& x);

class Mlp : public Module {
 public:
  // On CUDA in 16 bits, c_fc, GELU and c_proj's product run as one op with GELU in the
  // GEMMs' epilogues (Note [Fused tensor-parallel MLP] in parallel/tensor/layers.h).
  // Children "c_fc" (column-parallel over `model_group`) and "c_proj" (row-parallel); dropout on
  // the output, which every rank of the group holds whole, draws from `gen` (a replicated
  // stream: Note [Model-parallel dropout] in parallel/tensor/dropout_streams.h).
  // With `async` (collectives over the group) c_fc's input gradient is summed under its
  // weight gradient's product (Note [Overlapped input gradients] in parallel/tensor/layers.h),
  // and start() and finish() may be used.
  Mlp(const GptConfig& cfg, Generator& gen, parallel::Communicator& model_group,
      parallel::AsyncCollectives* async = nullptr);
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)
  // forward() in two calls around c_proj's sum over the group (Note [Batch-split overlap]
  // in models/gpt2/batch_split.h): start() runs up to the sum, started; finish() waits for
  // it and applies c_proj's bias and the dropout. Needs `async`.
  parallel::PendingSum start(const Tensor& x) const;         // (B, T, C) -> pending (B, T, C)
  Tensor finish(const parallel::PendingSum& pending) const;  // -> (B, T, C)

 private:
  parallel::ColumnParallelLinear c_fc_;
  parallel::RowParallelLinear c_proj_;
  Dropout dropout_;
};

}  // namespace tessera
