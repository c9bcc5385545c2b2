#include "parallel/tensor/layers.h"

#include <utility>
#include <vector>

#include "autograd/gradient_wait.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"
#include "parallel/tensor/mappings.h"

namespace tessera::parallel {
namespace {

// n / size, with an error naming the layer when it does not divide.
int64_t split_size(const char* layer, const char* what, int64_t n, int64_t blocks, int size) {
  TS_CHECK(n % (blocks * size) == 0, "[", layer, "] ", what, " ", n,
           " does not split over a model-parallel group of ", size,
           blocks > 1 ? " in " + std::to_string(blocks) + " blocks" : std::string(),
           "; expected a multiple of ", blocks * size);
  return n / size;
}

// x as a column-parallel product's input, and what that product's backward does with x's
// gradient: nothing (copy_to_model_parallel sums it in its own backward) or start its sum
// (Note [Overlapped input gradients]; the sum is waited for where x's gradient is used,
// Note [Deferred gradient waits] in autograd/gradient_wait.h).
std::pair<Tensor, StartGradReduction> column_parallel_input(const Tensor& x, Communicator& group,
                                                            AsyncCollectives* async) {
  if (async == nullptr || group.size() == 1) return {copy_to_model_parallel(x, group), {}};
  TS_CHECK(&async->comm() == &group, "[tensor parallel] expected async collectives over \"",
           group.name(), "\", found them over \"", async->comm().name(), "\"");
  const auto [input, wait] = await_gradient(x);
  return {input, [async, wait = wait](const Tensor& dx) {
            const CommHandle sum = async->all_reduce(dx);
            wait->set([sum] { sum.wait(); });
          }};
}

}  // namespace

Tensor column_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              Communicator& group, AsyncCollectives* async) {
  const auto [input, reduce_input_grad] = column_parallel_input(x, group, async);
  return linear(input, weight, bias, reduce_input_grad);
}

Tensor gelu_mlp_partial(const Tensor& x, const ColumnParallelLinear& fc,
                        const RowParallelLinear& proj) {
  TS_CHECK(
      !fc.gather_output_ && fc.parts_ == 1 && proj.input_is_parallel_ && &fc.group_ == &proj.group_,
      "[tensor parallel] a fused MLP expects fc without gathered output or parts and proj "
      "with parallel input, over one group");
  const ModuleCall fc_call(fc);
  const ModuleCall proj_call(proj);
  const auto [input, reduce_input_grad] = column_parallel_input(x, fc.group_, fc.async_);
  const bool whole = proj.group_.size() == 1;  // the bias goes in the partial
  const Tensor z = dense_gelu_dense(input, fc.weight_, fc.bias_, proj.weight_,
                                    whole ? proj.bias_ : Tensor(), reduce_input_grad);
  return proj_call.output(fc_call.output(z));
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                           Communicator& group, bool gather_output, int64_t parts,
                                           DType dtype, AsyncCollectives* async)
    : group_(group), gather_output_(gather_output), parts_(parts), async_(async) {
  const int64_t local =
      split_size("ColumnParallelLinear", "out_features", out_features, parts, group.size());
  const Placement rows{Placement::Kind::sharded, 0, parts};
  weight_ = zeros({local, in_features}, {dtype});
  register_parameter("weight", weight_, rows);
  if (bias) {
    bias_ = zeros({local}, {dtype});
    register_parameter("bias", bias_, rows);
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  const Tensor y = column_parallel_linear(x, weight_, bias_, group_, async_);  // (..., out / size)
  if (!gather_output_) return y;
  const Tensor all = gather_from_model_parallel(y, group_);  // rank-major: r0's parts, r1's...
  if (parts_ == 1) return all;
  // Back to the dense layout, part-major: every rank's q, then every rank's k, then v.
  const int64_t piece = y.size(-1) / parts_;
  std::vector<Tensor> pieces;
  for (int64_t p = 0; p < parts_; ++p) {
    for (int r = 0; r < group_.size(); ++r) {
      pieces.push_back(narrow(all, -1, (r * parts_ + p) * piece, piece));
    }
  }
  return cat(pieces, -1);
}

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                     Communicator& group, bool input_is_parallel, DType dtype,
                                     AsyncCollectives* async)
    : group_(group), input_is_parallel_(input_is_parallel), async_(async) {
  TS_CHECK(async == nullptr || &async->comm() == &group,
           "[RowParallelLinear] expected async collectives over \"", group.name(),
           "\", found them over \"", async->comm().name(), "\"");
  const int64_t local =
      split_size("RowParallelLinear", "in_features", in_features, 1, group.size());
  weight_ = zeros({out_features, local}, {dtype});
  register_parameter("weight", weight_, {Placement::Kind::sharded, 1, 1});
  if (bias) {
    bias_ = zeros({out_features}, {dtype});
    register_parameter("bias", bias_);
  }
}

Tensor RowParallelLinear::partial(const Tensor& x) const {
  // One rank: the dense linear, its bias fused into the GEMM.
  if (group_.size() == 1) return linear(x, weight_, bias_);
  const Tensor mine = input_is_parallel_ ? x : scatter_to_model_parallel(x, group_);
  return linear(mine, weight_, Tensor());  // (..., out)
}

Tensor RowParallelLinear::summed(const Tensor& partial) const {
  if (group_.size() == 1) return partial;
  const Tensor y = reduce_from_model_parallel(partial, group_);  // (..., out)
  return bias_.defined() ? add(y, bias_) : y;
}

Tensor RowParallelLinear::forward(const Tensor& x) const { return summed(partial(x)); }

Tensor RowParallelLinear::with_bias(const Tensor& sum) const {
  if (group_.size() == 1 || !bias_.defined()) return sum;  // a group of one's has it
  const ModuleCall call(*this);                            // the bias is read
  return call.output(add(sum, bias_));
}

Tensor RowParallelLinear::reduce(const Tensor& partial) const {
  return with_bias(group_.size() == 1 ? partial : reduce_from_model_parallel(partial, group_));
}

PendingSum RowParallelLinear::start(const Tensor& x) const {
  const ModuleCall call(*this);
  return start_reduce(call.output(partial(x)));
}

PendingSum RowParallelLinear::start_reduce(const Tensor& partial) const {
  TS_CHECK(async_ != nullptr, "[RowParallelLinear] start: expected a layer built with async ",
           "collectives over \"", group_.name(), "\", found none");
  return start_reduce_from_model_parallel(partial, *async_);  // a group of one: as it is
}

Tensor RowParallelLinear::finish(const PendingSum& pending) const {
  pending.handle.wait();
  return with_bias(pending.sum);
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim,
                                               Communicator& group, DType dtype)
    : group_(group) {
  const int64_t local =
      split_size("VocabParallelEmbedding", "num_embeddings", num_embeddings, 1, group.size());
  first_ = group.rank() * local;
  weight_ = zeros({local, embedding_dim}, {dtype});
  register_parameter("weight", weight_, {Placement::Kind::sharded, 0, 1});
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  if (group_.size() == 1) return embedding(weight_, ids);  // the dense lookup
  const int64_t rows = weight_.size(0);
  Tensor local_ids, mask;  // (...) ids in this rank's table (0 elsewhere); 1 where it has them
  {
    // Integer ids in f64 (exact below 2^53): the elementwise kernels do floating math.
    NoGradGuard no_grad;
    using kernels::BinaryOp;
    using kernels::CompareOp;
    const TensorOptions f64{DType::f64, ids.device()};
    const Tensor shifted =
        kernels::binary(BinaryOp::sub, ids.to(DType::f64), scalar_tensor(first_, f64));
    const Tensor in_range = kernels::binary(
        BinaryOp::mul,
        kernels::compare(CompareOp::ge, shifted, scalar_tensor(0, f64)).to(DType::f64),
        kernels::compare(CompareOp::lt, shifted, scalar_tensor(rows, f64)).to(DType::f64));
    local_ids = kernels::binary(BinaryOp::mul, shifted, in_range).to(DType::i64);
    mask = in_range.to(weight_.dtype()).unsqueeze(-1);  // (..., 1)
  }
  // Rows for ids of other ranks are zeroed, so their gradient (to row 0) is zero too.
  const Tensor partial = mul(embedding(weight_, local_ids), mask);  // (..., C)
  return reduce_from_model_parallel(partial, group_);
}

}  // namespace tessera::parallel
