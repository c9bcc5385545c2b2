// Megatron's tensor-parallel mappings (megatron/core/tensor_parallel/mappings.py) as
// autograd ops over a model-parallel group. Each is the other's transpose: what one does in
// forward, its partner does in backward.
//
//   copy_to_model_parallel      forward: identity        backward: all-reduce (sum)
//   reduce_from_model_parallel  forward: all-reduce      backward: identity
//   scatter_to_model_parallel   forward: own last-dim slice   backward: all-gather last dim
//   gather_from_model_parallel  forward: all-gather last dim  backward: own last-dim slice
//
// A column-parallel linear starts with copy_to (its input is replicated, its input
// gradient a sum of every rank's part); a row-parallel linear ends with reduce_from (the
// partial products add up). The group must stay alive until backward has run. Over a
// group of one each returns its input itself and records nothing.
#pragma once

#include "autograd/module.h"
#include "core/tensor.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

Tensor copy_to_model_parallel(const Tensor& x, Communicator& group);      // (...) -> (...)
Tensor reduce_from_model_parallel(const Tensor& x, Communicator& group);  // (...) -> (...)
// A sum over the model-parallel group that has been started and not yet waited for: `sum`
// holds it once `handle.wait()` has returned, and nothing reads `sum` before.
struct PendingSum {
  Tensor sum;
  CommHandle handle;
};

// reduce_from_model_parallel with its all-reduce started on `async` (collectives over the
// group) and not waited for (Note [Batch-split overlap] in models/gpt2/batch_split.h): the
// sum is formed in x's own memory when x is contiguous, so the caller reads neither x nor
// the result's `sum` before waiting on its handle. Over a group of one: x, nothing to wait
// for. (...) -> (...)
PendingSum start_reduce_from_model_parallel(const Tensor& x, AsyncCollectives& async);
// (..., n * size) -> (..., n): this rank's slice; throws unless size divides the last dim.
Tensor scatter_to_model_parallel(const Tensor& x, Communicator& group);
// (..., n) -> (..., n * size): the ranks' slices side by side in rank order.
Tensor gather_from_model_parallel(const Tensor& x, Communicator& group);

// The slice rank `rank` of `size` holds of a full tensor split along `dim` into `parts`
// equal blocks, each cut into `size` pieces (parts = 3 for a fused q, k, v projection: the
// rank takes its heads' rows of q, of k and of v). Throws unless size * parts divides the
// dim. Contiguous.
Tensor model_parallel_slice(const Tensor& full, int64_t dim, int64_t parts, int rank, int size);

// The inverse over the group: every rank's slice of a parameter placed as `placement`
// (Module::register_parameter), all-gathered into the full tensor on every rank. A
// replicated tensor comes back as it is. Collective over `group`.
Tensor gather_model_parallel_slices(const Tensor& slice, const Placement& placement,
                                    Communicator& group);

}  // namespace tessera::parallel
