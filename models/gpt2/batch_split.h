// GPT blocks over a micro-batch cut into pieces, so that the tensor-parallel sums of one
// piece travel while another piece computes.
//
// Note [Batch-split overlap]
// Under tensor slicing each of a block's two sub-layers ends with a sum over the model group
// (the row-parallel products: attention's c_proj and the MLP's), and the next sub-layer
// needs that sum, so in a whole-batch forward nothing computes while it travels. The rows of
// different sequences never meet inside a block (attention mixes the positions of one
// sequence), so a micro-batch cut along the batch dim gives independent pieces: while one
// piece's sum travels, the next piece computes its sub-layer. This is DeepSpeed's Domino
// (deepspeed/runtime/domino/transformer.py; Wang et al., "Domino: Eliminating Communication
// in LLM Training via Generic Tensor Slicing and Overlapping", arXiv 2409.15241). The
// sub-layers run in order, piece by piece, each piece first finishing its previous sub-layer
// (waiting for its sum, adding the residual) and then starting the next one. With 2 pieces:
//
//   computing:  attn 0 (p0)  attn 0 (p1)  mlp 0 (p0)   mlp 0 (p1)   attn 1 (p0)  ...
//   travelling:              sum (p0)     sum (p1)     sum (p0)     sum (p1)     ...
//
// so a piece's sum travels under the other pieces' sub-layer, and only the last piece's last
// sum is waited for with nothing left to compute. The model group's async collectives run the
// sums in the order they were started, the same on every rank of the group. After the blocks
// the pieces are joined again (one copy of the activations).
//
// The forward gives the whole-batch forward's bits on the CPU, whose GEMMs compute each row
// the same way whatever the number of rows, when the dropout layers draw the same masks:
// each layer's draws come in the pieces' order, which is the rows' order, and a draw
// advances the Philox offset by blocks of four words (core/philox.h), so the masks agree
// when every piece but the last has a multiple of 4 elements in every dropout layer. On
// CUDA, cuBLASLt picks its algorithm by the row count, so a piece's rows may round
// differently. In backward each weight's gradient is a sum of the pieces' products, so it
// differs from the whole-batch run by rounding. The pieces' backward passes are independent
// branches of the graph until the blocks' input, so a column-parallel layer's input-gradient
// sum of one piece travels while the engine computes the other pieces' backward (Note
// [Deferred gradient waits] in autograd/gradient_wait.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "models/gpt2/block.h"

namespace tessera {

// One block to run and the divisor of its sub-layers' outputs (progressive layer drop's
// scale; 1: none).
struct BlockCall {
  const Block* block;
  double divisor = 1.0;
};

// Runs `blocks` in order over x cut into `pieces` near-equal pieces along the batch dim (one
// per sequence when x has fewer), overlapping each piece's sums as Note [Batch-split
// overlap] says, and joins the pieces. Every block must be dense and built with async
// collectives over its model group. (B, T, C) -> (B, T, C)
Tensor run_batch_split(const std::vector<BlockCall>& blocks, const Tensor& x, int64_t pieces);

}  // namespace tessera
