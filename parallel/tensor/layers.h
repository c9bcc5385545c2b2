// Megatron's tensor-parallel layers (megatron/core/tensor_parallel/layers.py) over a
// model-parallel group. Each
// holds this rank's slice of the dense layer's parameters under the dense names ("weight",
// "bias") with a sharded Placement, so a checkpoint of the full tensors maps onto any
// model-parallel size through model_parallel_slice (parallel/tensor/mappings.h). With a
// group of one they compute exactly what the dense layers compute. Parameters start at
// zero: models initialize the full logical tensor by name and load each rank's slice.
//
// Note [Overlapped input gradients]
// A column-parallel layer's input is replicated, so its gradient is the sum over the group
// of each rank's partial x-gradient (Megatron's copy_to_model_parallel_region backward).
// Given async collectives over the group, the layer's backward starts that all-reduce as
// soon as its x-gradient is computed and computes the weight's and bias's gradients while
// it travels (Megatron-LM's --async-tensor-model-parallel-allreduce,
// LinearWithGradAccumulationAndAsyncCommunication; autograd's linear() with a
// StartGradReduction); the wait sits where the x-gradient is used, after whatever else of
// backward is ready (Note [Deferred gradient waits] in autograd/gradient_wait.h). The sum is
// the blocking one, so the gradients are the same bits. While sums are in flight no other
// backward op may call the group's blocking collectives: among these layers the scatter in
// front of a RowParallelLinear without input_is_parallel does, which no model combines with
// async column-parallel layers; activation checkpointing with partition_activations
// gathers each segment's input over the group when the segment's backward starts
// (parallel/engine/checkpoint_policy.cc), which is safe because a GPT's checkpoint segments
// are a chain: every sum outside them has been waited for when the engine reaches one, and
// a segment's own backward waits for its sums before it returns. On NCCL the sum is queued on the
// group's stream and the wait orders the compute stream after it (Note [Device-queued
// operations] in parallel/comm/communicator.h); the model's owner waits on the host before
// the optimizer step (TrainableModel::wait_for_communication), where a failure surfaces.
// Backends that cannot overlap (host staging, MPI below MPI_THREAD_MULTIPLE) sum at once.
#pragma once

#include <cstdint>

#include "autograd/module.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/communicator.h"
#include "parallel/tensor/mappings.h"

namespace tessera::parallel {

class ColumnParallelLinear;
class RowParallelLinear;

// Note [Fused tensor-parallel MLP]
// fc -> GELU -> proj over two tensor-parallel layers as one dense_gelu_dense op
// (autograd/ops/linalg.h; GELU in the GEMMs' epilogues on CUDA with 16-bit operands): fc
// column-parallel without a gathered output, proj row-parallel taking it as its parallel
// input, so each rank's GELU reads only its own hidden features, as with the separate
// layers. Returns proj's partial product on this rank, to be summed by proj.reduce() or
// proj.start_reduce(): x's gradient is summed over the group as fc's own forward arranges
// (Note [Overlapped input gradients]), and proj's bias is in the partial only over a group
// of one (otherwise added after the sum). Both layers' calls are open around the op (module
// hooks see both; forward observers see it inside proj). Throws unless the layers are
// shaped so and share a group. (..., in) -> (..., out)
Tensor gelu_mlp_partial(const Tensor& x, const ColumnParallelLinear& fc,
                        const RowParallelLinear& proj);

// The product of a replicated input and a row-split weight:
// linear(copy_to_model_parallel(x, group), weight, bias), or with `async` (collectives over
// `group`) the same with the input gradient's sum overlapped (Note [Overlapped input
// gradients]). (..., in), (out / size, in), (out / size) or undefined -> (..., out / size)
Tensor column_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              Communicator& group, AsyncCollectives* async);

// y = x W^T + b with W (out, in) split by rows: this rank computes out / size features.
// `parts` > 1 splits each of that many equal row blocks on its own (a fused q, k, v
// projection, parts 3: every rank gets the q, k and v rows of its heads).
class ColumnParallelLinear : public Layer {
 public:
  // Parameters "weight" (out / size, in) and, with `bias`, "bias" (out / size), both sharded
  // on dim 0. Throws unless size * parts divides out. With `gather_output` the forward
  // returns the full (..., out) on every rank, in the dense layout; otherwise this rank's
  // (..., out / size). With `async` (collectives over `group`, which must outlive the
  // layer) the input gradient's sum over the group travels while backward computes the
  // weight's gradient (Note [Overlapped input gradients]).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, Communicator& group,
                       bool gather_output = false, int64_t parts = 1, DType dtype = DType::f32,
                       AsyncCollectives* async = nullptr);

 protected:
  Tensor forward(const Tensor& x) const override;  // (..., in), the same on every rank -> see above

 private:
  friend Tensor gelu_mlp_partial(const Tensor& x, const ColumnParallelLinear& fc,
                                 const RowParallelLinear& proj);

  Communicator& group_;
  bool gather_output_;
  int64_t parts_;
  AsyncCollectives* async_;
  Tensor weight_;
  Tensor bias_;
};

// y = x W^T + b with W (out, in) split by columns: this rank multiplies its in / size input
// features and the partial products are summed over the group; the bias is added once,
// after the sum.
class RowParallelLinear : public Layer {
 public:
  // Parameters "weight" (out, in / size) sharded on dim 1 and, with `bias`, "bias" (out)
  // replicated. Throws unless size divides in. With `input_is_parallel` the forward takes
  // this rank's (..., in / size) (a column-parallel layer's output); otherwise the full
  // (..., in), of which it keeps its slice. `async` (collectives over `group`, which must
  // outlive the layer) is for start() and finish().
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, Communicator& group,
                    bool input_is_parallel = true, DType dtype = DType::f32,
                    AsyncCollectives* async = nullptr);

  // The forward in two calls, so that the sum over the group travels in between (Note
  // [Batch-split overlap] in models/gpt2/batch_split.h): start() computes this rank's partial
  // product and starts its sum on the layer's async collectives; finish() waits for it and
  // adds the bias. Together they compute what the forward does. start() throws without
  // async collectives. (..., in / size) [or (..., in)] -> pending (..., out) -> (..., out)
  PendingSum start(const Tensor& x) const;
  Tensor finish(const PendingSum& pending) const;
  // The forward's output, or start(), from a partial product made elsewhere
  // (gelu_mlp_partial): sums it over the group and adds the bias, which a group of one's
  // partial already holds. Over several ranks the bias is read in a call of its own, as in
  // finish() (ZeRO-3's hooks, which would gather the layer again there, do not run with
  // tensor slicing). (..., out) -> (..., out)
  Tensor reduce(const Tensor& partial) const;
  PendingSum start_reduce(const Tensor& partial) const;

 protected:
  Tensor forward(const Tensor& x) const override;  // -> (..., out), the same on every rank

 private:
  friend Tensor gelu_mlp_partial(const Tensor& x, const ColumnParallelLinear& fc,
                                 const RowParallelLinear& proj);
  // This rank's partial product (with the bias over a group of one), inside a call.
  Tensor partial(const Tensor& x) const;
  // The partial summed over the group plus the bias, inside a call.
  Tensor summed(const Tensor& partial) const;
  // A sum over the group plus the bias, read in a call of its own; a group of one's sum as
  // it is (its partial holds the bias).
  Tensor with_bias(const Tensor& sum) const;

  Communicator& group_;
  bool input_is_parallel_;
  AsyncCollectives* async_;
  Tensor weight_;
  Tensor bias_;
};

// An embedding table (V, C) split by rows: this rank holds ids [r V / size, (r + 1) V / size);
// ids outside its range give zero rows, and the sum over the group is the full lookup.
class VocabParallelEmbedding : public Layer {
 public:
  // Parameter "weight" (V / size, C) sharded on dim 0. Throws unless size divides V.
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, Communicator& group,
                         DType dtype = DType::f32);
  const Tensor& weight() const { return weight_; }
  int64_t first_id() const { return first_; }

 protected:
  Tensor forward(const Tensor& ids) const override;  // (...) i32|i64 -> (..., C)

 private:
  Communicator& group_;
  int64_t first_;  // the first id of this rank's rows
  Tensor weight_;
};

}  // namespace tessera::parallel
