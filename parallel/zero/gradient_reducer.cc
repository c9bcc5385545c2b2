#include "parallel/zero/gradient_reducer.h"

#include <algorithm>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"

namespace tessera::parallel {

const std::vector<int64_t>& GradientReducer::swap_ids() const {
  static const std::vector<int64_t> kNone;
  return kNone;
}

void GradientReducer::each_param_piece(int64_t block, const Tensor& own,
                                       const std::function<void(int64_t, const Tensor&)>& f) const {
  const FlatLayout::Block& blk = layout_.blocks[block];
  const int64_t chunk_begin = layout_.chunk_offset(block, dp_.rank());
  for (int64_t i = blk.first_param; i < blk.end_param; ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    const int64_t begin = std::max(p.offset, chunk_begin);
    const int64_t end = std::min(p.offset + p.numel, chunk_begin + blk.chunk);
    if (end > begin) f(i, own.narrow(0, begin - chunk_begin, end - begin));
  }
}

Tensor GradientReducer::chunks_squared_norm(const std::vector<bool>& counted) const {
  const Tensor sq = zeros({}, {DType::f64, device_});
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const Tensor own = own_chunk(static_cast<int64_t>(b));
    if (counted.empty()) {
      kernels::add_squared_norm(own, sq);
      continue;
    }
    // The counted parameters' elements inside this rank's chunk of the block.
    each_param_piece(static_cast<int64_t>(b), own, [&](int64_t i, const Tensor& piece) {
      if (counted[i]) kernels::add_squared_norm(piece, sq);
    });
  }
  return sq;
}

void GradientReducer::scale_chunks(double factor) {
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    kernels::scale_(own_chunk(static_cast<int64_t>(b)), factor);
  }
}

namespace {

// Whether two contiguous tensors share any byte.
bool overlap(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.raw_data());
  const auto* b0 = static_cast<const char*>(b.raw_data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

void GradientReducer::set_async(AsyncCollectives* async, int64_t bucket_numel) {
  async_ = async;
  bucket_numel_ = bucket_numel;
}

void GradientReducer::finish_oldest() {
  const InFlight oldest = std::move(in_flight_.front());
  in_flight_.pop_front();
  in_flight_numel_ -= oldest.numel;
  oldest.handle.wait();
  oldest.finish();
}

void GradientReducer::finish_reductions() {
  while (!in_flight_.empty()) finish_oldest();
}

void GradientReducer::make_room(int64_t numel) {
  const int64_t limit = static_cast<int64_t>(kMaxInFlight) * std::max(bucket_numel_, numel);
  while (!in_flight_.empty() && in_flight_numel_ + numel > limit) finish_oldest();
}

void GradientReducer::average_into(const Tensor& sum, const std::vector<Tensor>& outs,
                                   int64_t chunk, bool scatter, bool reduce_scatter, bool add,
                                   const std::function<void()>& then) {
  TS_INTERNAL_ASSERT(add || outs.size() == 1, "only added results go to several outputs; found ",
                     outs.size(), " outputs to write");
  const Tensor& out = outs.front();
  // Calls f(output, its part of `t`) for each output, in order.
  const auto each_out = [outs](const Tensor& t, const auto& f) {
    int64_t offset = 0;
    for (const Tensor& o : outs) {
      f(o, t.narrow(0, offset, o.numel()));
      offset += o.numel();
    }
  };
  const int world = averaging_.mean_over > 0 ? averaging_.mean_over : dp_.size();
  if (dp_.size() == 1) {  // nothing crosses a wire, so nothing is rounded to its dtype
    const double mean = 1.0 / world;
    if (add) {
      each_out(sum, [mean](const Tensor& o, const Tensor& s) {
        kernels::axpy_(o, s.to(DType::f32), mean);
      });
    } else {
      if (sum.raw_data() != out.raw_data()) out.copy_(sum);
      if (world != 1) kernels::scale_(out, mean);
    }
    if (then) then();
    return;
  }
  // The reduction's buffer, in the communication dtype: `sum` itself, or `out` when it is
  // the whole f32 block, or a converted copy.
  Tensor buffer = sum;
  if (sum.dtype() != averaging_.communication) {
    if (!scatter && !add && averaging_.communication == DType::f32) {
      out.copy_(sum);
      buffer = out;
    } else {
      buffer = sum.to(averaging_.communication);
    }
  }
  // Note [Gradient averaging].
  const bool divide_first = is_half(averaging_.communication) || averaging_.prescale;
  const double pre = divide_first ? 1.0 / world : 1.0 / averaging_.predivide_factor;
  const double post = divide_first ? 1.0 : averaging_.predivide_factor / world;
  if (pre != 1.0) kernels::scale_(buffer, pre);
  Tensor reduced;
  const bool scattered = scatter && reduce_scatter;
  if (scattered) {
    const bool direct = averaging_.communication == DType::f32 && !add && !overlap(out, buffer);
    reduced = direct ? out : empty({chunk}, {averaging_.communication, device_});
  } else {
    reduced = scatter ? buffer.narrow(0, dp_.rank() * chunk, chunk) : buffer;
  }
  std::function<void()> finish = [out, each_out, reduced, add, post, then] {
    if (add) {
      each_out(reduced, [post](const Tensor& o, const Tensor& r) {
        kernels::axpy_(o, r.to(DType::f32), post);
      });
    } else {
      if (reduced.raw_data() != out.raw_data()) out.copy_(reduced);
      if (post != 1.0) kernels::scale_(out, post);
    }
    if (then) then();
  };
  if (async_ == nullptr) {
    if (scattered) {
      dp_.reduce_scatter(buffer, reduced);
    } else {
      dp_.all_reduce(buffer);
    }
    finish();
    return;
  }
  // Note [Overlapped reductions].
  make_room(buffer.numel());
  CommHandle handle =
      scattered ? async_->reduce_scatter(buffer, reduced) : async_->all_reduce(buffer);
  in_flight_numel_ += buffer.numel();
  in_flight_.push_back({std::move(handle), buffer.numel(), std::move(finish)});
  peak_.reductions = std::max(peak_.reductions, static_cast<int64_t>(in_flight_.size()));
  peak_.numel = std::max(peak_.numel, in_flight_numel_);
}

FlatGradients::FlatGradients(Communicator& dp, const FlatLayout& layout,
                             std::vector<Tensor>& params, DType dtype, DType accumulation,
                             const Averaging& averaging, Device device)
    : GradientReducer(dp, layout, params, device, averaging),
      f32_accumulation_(is_half(dtype) && accumulation == DType::f32) {
  model_grads_ = zeros({layout.numel}, {dtype, device});
}

void FlatGradients::zero_grad() {
  NoGradGuard no_grad;
  model_grads_.fill_(0.0);
  summed_ = false;
  // Backward accumulates into these views in place (AccumulateGrad).
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    params_[i].set_grad(model_grads_.narrow(0, p.offset, p.numel).view(p.shape));
  }
}

void FlatGradients::end_micro_batch() {
  if (!f32_accumulation_) return;
  NoGradGuard no_grad;
  if (!f32_sum_.defined()) f32_sum_ = empty({layout_.numel}, {DType::f32, device_});
  // Block by block, so the widened copy is one block at a time.
  for (const FlatLayout::Block& b : layout_.blocks) {
    const Tensor sum = f32_sum_.narrow(0, b.offset, b.numel);
    const Tensor grads = model_grads_.narrow(0, b.offset, b.numel);
    if (summed_) {
      kernels::axpy_(sum, grads.to(DType::f32));
    } else {
      sum.copy_(grads);
    }
  }
  model_grads_.fill_(0.0);
  summed_ = true;
}

Tensor FlatGradients::block_sum(int64_t block) {
  const FlatLayout::Block& b = layout_.blocks[block];
  const Tensor grads = model_grads_.narrow(0, b.offset, b.numel);
  if (!summed_) return grads;
  const Tensor sum = f32_sum_.narrow(0, b.offset, b.numel);
  kernels::axpy_(sum, grads.to(DType::f32));
  return sum;
}

int64_t FlatGradients::bytes() const {
  int64_t n = static_cast<int64_t>(model_grads_.nbytes());
  if (f32_sum_.defined()) n += static_cast<int64_t>(f32_sum_.nbytes());
  return n;
}

AllReduceGradients::AllReduceGradients(Communicator& dp, const FlatLayout& layout,
                                       std::vector<Tensor>& params, DType dtype, DType accumulation,
                                       const Averaging& averaging, Device device)
    : FlatGradients(dp, layout, params, dtype, accumulation, averaging, device) {
  if (is_half(dtype)) f32_sum_ = zeros({layout.numel}, {DType::f32, device});
  averaged_ = is_half(dtype) ? f32_sum_ : model_grads_;
}

void AllReduceGradients::reduce_block(int64_t block, bool communicate) {
  NoGradGuard no_grad;
  const FlatLayout::Block& b = layout_.blocks[block];
  const Tensor sum = block_sum(block);
  const Tensor out = averaged_.narrow(0, b.offset, b.numel);
  if (communicate) {
    average_into(sum, {out}, b.chunk, false, false, false);
  } else if (sum.raw_data() != out.raw_data()) {
    out.copy_(sum);  // the 1-bit optimizer takes local gradients
  }
}

Tensor AllReduceGradients::own_chunk(int64_t block) const {
  return averaged_.narrow(0, layout_.chunk_offset(block, dp_.rank()), layout_.blocks[block].chunk);
}

Tensor AllReduceGradients::param_grad(int64_t i) const {
  const FlatLayout::Param& p = layout_.params[i];
  return averaged_.narrow(0, p.offset, p.numel).view(p.shape);
}

Tensor AllReduceGradients::squared_norm(const std::vector<bool>& counted) const {
  const Tensor sq = zeros({}, {DType::f64, device_});
  if (counted.empty()) {
    kernels::add_squared_norm(averaged_, sq);
    return sq;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    if (counted[i]) kernels::add_squared_norm(averaged_.narrow(0, p.offset, p.numel), sq);
  }
  return sq;
}

void AllReduceGradients::scale(double factor) { kernels::scale_(averaged_, factor); }

ReduceScatterGradients::ReduceScatterGradients(Communicator& dp, const FlatLayout& layout,
                                               std::vector<Tensor>& params, DType dtype,
                                               DType accumulation, const Averaging& averaging,
                                               Device device, bool reduce_scatter)
    : FlatGradients(dp, layout, params, dtype, accumulation, averaging, device),
      reduce_scatter_(reduce_scatter) {
  if (is_half(dtype)) grad_shard_ = zeros({layout.shard_numel()}, {DType::f32, device});
}

Tensor ReduceScatterGradients::own_chunk(int64_t block) const {
  const FlatLayout::Block& b = layout_.blocks[block];
  if (grad_shard_.defined()) return grad_shard_.narrow(0, b.shard_offset, b.chunk);
  return model_grads_.narrow(0, layout_.chunk_offset(block, dp_.rank()), b.chunk);
}

void ReduceScatterGradients::reduce_block(int64_t block, bool) {
  NoGradGuard no_grad;
  average_into(block_sum(block), {own_chunk(block)}, layout_.blocks[block].chunk, true,
               reduce_scatter_, false);
}

int64_t ReduceScatterGradients::bytes() const {
  int64_t n = FlatGradients::bytes();
  if (grad_shard_.defined()) n += static_cast<int64_t>(grad_shard_.nbytes());
  return n;
}

BucketedGradients::BucketedGradients(Communicator& dp, const FlatLayout& layout,
                                     std::vector<Tensor>& params, const Averaging& averaging,
                                     Device device, bool reduce_scatter, int64_t coalesce_below,
                                     TensorSwapper* swapper)
    : GradientReducer(dp, layout, params, device, averaging),
      reduce_scatter_(reduce_scatter),
      coalesce_below_(coalesce_below),
      swapper_(swapper) {
  if (swapper_ == nullptr) {
    grad_shard_ = zeros({layout.shard_numel()}, {DType::f32, device});
    return;
  }
  TS_CHECK(device.is_cpu(), "[zero] gradients swapped to NVMe must be host tensors, found ",
           device.str());
  for (const FlatLayout::Block& b : layout.blocks) {
    int64_t id = 0;
    chunks_.push_back(swapper_->add_zeros(b.chunk, id));
    swap_ids_.push_back(id);
  }
  squares_.resize(layout.blocks.size());
}

void BucketedGradients::zero_grad() {
  NoGradGuard no_grad;
  if (swapper_ != nullptr) {
    swapper_->discard(swap_ids_);
    squares_.assign(squares_.size(), Squares{});
    pending_scales_.clear();
  } else {
    grad_shard_.fill_(0.0);
  }
  for (Tensor& p : params_) p.set_grad(Tensor());
  drop_collected();
}

Tensor BucketedGradients::own_chunk(int64_t block) const {
  if (swapper_ != nullptr) return chunks_[static_cast<size_t>(block)];
  const FlatLayout::Block& b = layout_.blocks[block];
  return grad_shard_.narrow(0, b.shard_offset, b.chunk);
}

std::function<void()> BucketedGradients::bring_in(const std::vector<int64_t>& blocks) {
  if (swapper_ == nullptr) return nullptr;
  std::vector<int64_t> ids;
  for (const int64_t b : blocks) ids.push_back(swap_ids_[static_cast<size_t>(b)]);
  swapper_->swap_in(ids);
  return [this, blocks, ids] {
    for (const int64_t b : blocks) {
      Squares& s = squares_[static_cast<size_t>(b)];
      const Tensor& own = chunks_[static_cast<size_t>(b)];
      s.whole = kernels::squared_norm(own);
      s.pieces.clear();
      each_param_piece(b, own, [&](int64_t i, const Tensor& piece) {
        s.pieces.emplace_back(i, kernels::squared_norm(piece));
      });
    }
    swapper_->swap_out(ids);
  };
}

Tensor BucketedGradients::squared_norm(const std::vector<bool>& counted) const {
  if (swapper_ == nullptr) return chunks_squared_norm(counted);
  // chunks_squared_norm's sum, from the squares taken as each chunk was written.
  double sq = 0.0;
  for (const Squares& s : squares_) {
    if (counted.empty()) {
      sq += s.whole;
      continue;
    }
    for (const auto& [i, squares] : s.pieces) {
      if (counted[i]) sq += squares;
    }
  }
  return scalar_tensor(sq, {DType::f64, device_});
}

void BucketedGradients::scale(double factor) {
  if (swapper_ == nullptr) {
    scale_chunks(factor);
  } else {
    pending_scales_.push_back(factor);
  }
}

void BucketedGradients::prepare_chunk(int64_t block) {
  for (const double factor : pending_scales_) kernels::scale_(own_chunk(block), factor);
}

int64_t BucketedGradients::bytes() const {
  if (swapper_ == nullptr) return static_cast<int64_t>(grad_shard_.nbytes());
  int64_t n = 0;
  for (const Tensor& c : chunks_) n += static_cast<int64_t>(c.storage().nbytes());
  return n;
}

void BucketedGradients::reduce_block(int64_t block, bool) {
  NoGradGuard no_grad;
  const FlatLayout::Block& b = layout_.blocks[block];
  if (b.numel < coalesce_below_) {  // Note [Coalesced reductions]
    collected_.emplace_back(block, take_gradient(block));
    collected_numel_ += b.numel;
    if (collected_numel_ >= coalesce_below_) reduce_collected();
    return;
  }
  make_room(b.numel);
  // Added: the shard accumulates over micro-batches, in f32.
  const Tensor gradient = take_gradient(block);
  average_into(gradient, {own_chunk(block)}, b.chunk, true, reduce_scatter_, true,
               bring_in({block}));
}

void BucketedGradients::reduce_collected() {
  if (collected_.empty()) return;
  NoGradGuard no_grad;
  make_room(collected_numel_);
  const Tensor buffer = empty({collected_numel_}, {collected_.front().second.dtype(), device_});
  const int64_t per_rank = collected_numel_ / dp_.size();  // every block's numel is W chunks
  std::vector<Tensor> outs;
  std::vector<int64_t> blocks;
  int64_t at = 0;  // where this block's chunks go in each rank's part
  for (auto& [block, gradient] : collected_) {
    const int64_t chunk = layout_.blocks[block].chunk;
    for (int r = 0; r < dp_.size(); ++r) {
      buffer.narrow(0, r * per_rank + at, chunk).copy_(gradient.narrow(0, r * chunk, chunk));
    }
    gradient = Tensor();  // copied: its memory goes now
    outs.push_back(own_chunk(block));
    blocks.push_back(block);
    at += chunk;
  }
  collected_.clear();
  collected_numel_ = 0;
  const std::function<void()> write_back = bring_in(blocks);
  average_into(buffer, outs, per_rank, true, reduce_scatter_, true, write_back);
}

void BucketedGradients::drop_collected() {
  collected_.clear();
  collected_numel_ = 0;
}

Tensor BucketedGradients::take_gradient(int64_t block) {
  const FlatLayout::Block& b = layout_.blocks[block];
  // Gather the block's gradients into one buffer and drop them. Every element is written
  // once: a gradient, or zero (padding, a parameter backward did not reach).
  // One rank communicates nothing: its gradients are not rounded to the wire's dtype.
  const Tensor buffer =
      empty({b.numel}, {dp_.size() == 1 ? DType::f32 : averaging_.communication, device_});
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
  return buffer;
}

}  // namespace tessera::parallel
