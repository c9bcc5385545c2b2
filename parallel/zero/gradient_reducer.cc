#include "parallel/zero/gradient_reducer.h"

#include <algorithm>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"

namespace tessera::parallel {

double GradientReducer::chunks_squared_norm(const std::vector<bool>& counted) const {
  double sq = 0.0;
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const Tensor own = own_chunk(static_cast<int64_t>(b));
    if (counted.empty()) {
      sq += kernels::squared_norm(own);
      continue;
    }
    // The counted parameters' elements inside this rank's chunk of the block.
    const FlatLayout::Block& blk = layout_.blocks[b];
    const int64_t chunk_begin = layout_.chunk_offset(static_cast<int64_t>(b), dp_.rank());
    for (int64_t i = blk.first_param; i < blk.end_param; ++i) {
      const FlatLayout::Param& p = layout_.params[i];
      const int64_t begin = std::max(p.offset, chunk_begin);
      const int64_t end = std::min(p.offset + p.numel, chunk_begin + blk.chunk);
      if (counted[i] && end > begin) {
        sq += kernels::squared_norm(own.narrow(0, begin - chunk_begin, end - begin));
      }
    }
  }
  return sq;
}

void GradientReducer::scale_chunks(double factor) {
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    kernels::scale_(own_chunk(static_cast<int64_t>(b)), factor);
  }
}

Tensor GradientReducer::reduce_to_chunk(const Tensor& buffer, int64_t chunk,
                                        bool reduce_scatter) const {
  if (reduce_scatter) {
    const Tensor reduced = empty({chunk}, {DType::f32, device_});
    dp_.reduce_scatter(buffer, reduced);
    return reduced;
  }
  dp_.all_reduce(buffer);
  return buffer.narrow(0, dp_.rank() * chunk, chunk);
}

FlatGradients::FlatGradients(Communicator& dp, const FlatLayout& layout,
                             std::vector<Tensor>& params, DType dtype, Device device)
    : GradientReducer(dp, layout, params, device) {
  flat_grads_ = zeros({layout.numel}, {DType::f32, device});
  if (dtype != DType::f32) flat_model_grads_ = zeros({layout.numel}, {dtype, device});
}

void FlatGradients::zero_grad() {
  NoGradGuard no_grad;
  flat_grads_.fill_(0.0);
  if (flat_model_grads_.defined()) flat_model_grads_.fill_(0.0);
  const Tensor& model_grads = flat_model_grads_.defined() ? flat_model_grads_ : flat_grads_;
  // Backward accumulates into these views in place (AccumulateGrad).
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    params_[i].set_grad(model_grads.narrow(0, p.offset, p.numel).view(p.shape));
  }
}

Tensor FlatGradients::own_chunk(int64_t block) const {
  return flat_grads_.narrow(0, layout_.chunk_offset(block, dp_.rank()),
                            layout_.blocks[block].chunk);
}

int64_t FlatGradients::bytes() const {
  int64_t n = static_cast<int64_t>(flat_grads_.nbytes());
  if (flat_model_grads_.defined()) n += static_cast<int64_t>(flat_model_grads_.nbytes());
  return n;
}

Tensor FlatGradients::param_grad(int64_t i) const {
  const FlatLayout::Param& p = layout_.params[i];
  return flat_grads_.narrow(0, p.offset, p.numel).view(p.shape);
}

Tensor FlatGradients::block_grad(int64_t block) {
  const FlatLayout::Block& b = layout_.blocks[block];
  const Tensor view = flat_grads_.narrow(0, b.offset, b.numel);
  // The 16-bit gradients become f32 before they are reduced (Note [Mixed precision]).
  if (flat_model_grads_.defined()) view.copy_(flat_model_grads_.narrow(0, b.offset, b.numel));
  return view;
}

void AllReduceGradients::reduce_block(int64_t block, bool communicate) {
  NoGradGuard no_grad;
  const Tensor view = block_grad(block);
  if (!communicate) return;  // the 1-bit optimizer takes local gradients
  dp_.all_reduce(view);
  if (dp_.size() > 1) kernels::scale_(view, 1.0 / dp_.size());  // x 1 would be a pass for nothing
}

double AllReduceGradients::squared_norm(const std::vector<bool>& counted) const {
  if (counted.empty()) return kernels::squared_norm(flat_grads_);
  double sq = 0.0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    if (counted[i]) sq += kernels::squared_norm(flat_grads_.narrow(0, p.offset, p.numel));
  }
  return sq;
}

void AllReduceGradients::scale(double factor) { kernels::scale_(flat_grads_, factor); }

void ReduceScatterGradients::reduce_block(int64_t block, bool) {
  NoGradGuard no_grad;
  const Tensor reduced =
      reduce_to_chunk(block_grad(block), layout_.blocks[block].chunk, reduce_scatter_);
  const Tensor own = own_chunk(block);
  if (reduced.raw_data() != own.raw_data()) own.copy_(reduced);
  if (dp_.size() > 1) kernels::scale_(own, 1.0 / dp_.size());
}

BucketedGradients::BucketedGradients(Communicator& dp, const FlatLayout& layout,
                                     std::vector<Tensor>& params, Device device,
                                     bool reduce_scatter)
    : GradientReducer(dp, layout, params, device), reduce_scatter_(reduce_scatter) {
  grad_shard_ = zeros({layout.shard_numel()}, {DType::f32, device});
}

void BucketedGradients::zero_grad() {
  NoGradGuard no_grad;
  grad_shard_.fill_(0.0);
  for (Tensor& p : params_) p.set_grad(Tensor());
}

Tensor BucketedGradients::own_chunk(int64_t block) const {
  const FlatLayout::Block& b = layout_.blocks[block];
  return grad_shard_.narrow(0, b.shard_offset, b.chunk);
}

void BucketedGradients::reduce_block(int64_t block, bool) {
  NoGradGuard no_grad;
  const FlatLayout::Block& b = layout_.blocks[block];
  // Gather the block's gradients into one buffer and drop them. Every element is written
  // once: a gradient, or zero (padding, a parameter backward did not reach).
  const Tensor buffer = empty({b.numel}, {DType::f32, device_});
  for (int64_t i = b.first_param; i < b.end_param; ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    const Tensor slot = buffer.narrow(0, p.offset - b.offset, p.numel);
    const Tensor g = params_[i].grad();
    if (g.defined()) {
      slot.copy_(g.reshape({p.numel}));
    } else {
      slot.fill_(0.0);
    }
    params_[i].set_grad(Tensor());
  }
  const FlatLayout::Param& last = layout_.params[b.end_param - 1];
  const int64_t used = last.offset + last.numel - b.offset;
  buffer.narrow(0, used, b.numel - used).fill_(0.0);
  const Tensor reduced = reduce_to_chunk(buffer, b.chunk, reduce_scatter_);
  kernels::axpy_(own_chunk(block), reduced, 1.0 / dp_.size());  // accumulates over micro-batches
}

}  // namespace tessera::parallel
