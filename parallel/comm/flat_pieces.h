// A tensor split into equal pieces over the ranks of a group, as DeepSpeed's
// PartitionedTensor splits one (deepspeed/runtime/utils.py): rank r holds elements
// [r * p, (r + 1) * p) of the flat values, p = ceil(n / size), the last piece zero-padded.
// Pipeline transfers and checkpointed activations keep only this rank's piece of a tensor
// its tensor-parallel group holds replicated, and all-gather it back when needed.
#pragma once

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// This rank's piece of t's flat values over `group` (ceil(numel / size) elements, on t's
// device): a view of t when it is contiguous and the piece needs no padding, a padded copy
// otherwise.
Tensor flat_piece(const Tensor& t, const Communicator& group);

// The tensor of `shape` whose pieces the ranks of `group` hold (each rank's `piece`, as
// flat_piece cut it), all-gathered on piece's device. Collective over `group`.
Tensor gather_flat_pieces(const Tensor& piece, const Shape& shape, Communicator& group);

}  // namespace tessera::parallel
