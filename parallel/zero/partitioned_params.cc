#include "parallel/zero/partitioned_params.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera::parallel {

PartitionedParams::PartitionedParams(Communicator& dp, const FlatLayout& layout,
                                     std::vector<Tensor> params, std::vector<Tensor> shard,
                                     const ZeroConfig& config, const ParameterInit& init,
                                     const ShardWrites& writes, TensorSwapper* chunk_swapper,
                                     bool host_chunks, bool pinned)
    : dp_(dp),
      layout_(layout),
      config_(config),
      params_(std::move(params)),
      shard_(std::move(shard)),
      chunk_swapper_(chunk_swapper) {
  NoGradGuard no_grad;
  const size_t n = params_.size();
  TS_INTERNAL_ASSERT(layout_.blocks.size() == n && layout_.params.size() == n && shard_.size() == n,
                     "stage 3 expects one block and one shard chunk per parameter");
  persistent_.assign(n, false);
  live_.assign(n, false);
  forward_pins_.assign(n, 0);
  backward_pinned_.assign(n, false);
  chunk_ids_.assign(n, -1);
  chunk_held_.assign(n, false);
  const DType dtype = n > 0 ? params_[0].dtype() : DType::f32;
  const Device device = n > 0 ? params_[0].device() : Device::cpu();
  TS_CHECK((chunk_swapper_ == nullptr && !host_chunks) || is_half(dtype),
           "[zero] offload_param moves the 16-bit shard of 16-bit parameters; found ",
           n > 0 ? params_[0].str() : std::string("none"),
           " (f32 parameters are their own masters: offload_optimizer moves those)");
  if (is_half(dtype) && chunk_swapper_ == nullptr) {
    model_shard_ = zeros({layout_.shard_numel()}, {dtype, host_chunks ? Device::cpu() : device});
    if (host_chunks && pinned) model_shard_ = model_shard_.pin_memory();
  }
  for (size_t i = 0; i < n; ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    const FlatLayout::Block& b = layout_.blocks[i];
    TS_INTERNAL_ASSERT(b.first_param == static_cast<int64_t>(i), "parameter ", p.name,
                       " shares its block");
    index_[params_[i].impl()] = static_cast<int64_t>(i);
    // The padded parameter, rank 0's values or the initializer's, then this rank's chunk
    // of it (in f32, and as the 16-bit source of the gathers).
    Tensor padded = zeros({b.numel}, {dtype, device});
    if (params_[i].materialized()) {
      padded.narrow(0, 0, p.numel).copy_(params_[i].reshape({p.numel}));
      dp_.broadcast(padded, 0);
    } else {
      TS_CHECK(init != nullptr, "[zero] parameter \"", p.name,
               "\" has no values (built under a DeferredInitGuard); expected an initializer");
      const Tensor whole = empty(p.shape);  // f32 on the CPU, as an unpartitioned build draws it
      init(p.name, whole);
      padded.narrow(0, 0, p.numel).copy_(whole.reshape({p.numel}));
    }
    const Tensor mine = padded.narrow(0, dp_.rank() * b.chunk, b.chunk);
    if (writes.before) writes.before(static_cast<int64_t>(i));
    shard_[i].copy_(mine);
    if (writes.after) writes.after(static_cast<int64_t>(i));
    persistent_[i] = p.numel <= config_.stage3_param_persistence_threshold;
    if (model_shard_.defined()) {
      model_chunks_.push_back(model_shard_.narrow(0, b.shard_offset, b.chunk));
    } else if (chunk_swapper_ != nullptr && !persistent_[i]) {
      // In memory only while construction writes it (a fresh mapping's zeros, no read).
      model_chunks_.push_back(chunk_swapper_->add_zeros(b.chunk, chunk_ids_[i], dtype));
      chunk_swapper_->swap_in({chunk_ids_[i]});
    } else if (chunk_swapper_ != nullptr) {
      model_chunks_.push_back(zeros({b.chunk}, {dtype, device}));
    }
    if (!model_chunks_.empty()) model_chunks_[i].copy_(mine);
    if (chunk_ids_[i] >= 0) chunk_swapper_->swap_out({chunk_ids_[i]});
    params_[i].set_data(padded.narrow(0, 0, p.numel).view(p.shape));
    gather_.push_back(padded);
    if (persistent_[i]) {
      live_[i] = true;
    } else {
      padded.storage().release();
    }
  }
}

const std::vector<int64_t>& PartitionedParams::params_of(const Module& m) {
  auto [it, fresh] = module_params_.try_emplace(&m);
  if (fresh) {
    for (const Tensor& t : m.own_parameters()) {
      const auto found = index_.find(t.impl());
      if (found != index_.end() && !persistent_[found->second]) {
        it->second.push_back(found->second);
      }
    }
  }
  return it->second;
}

void PartitionedParams::set_async(AsyncCollectives* async) {
  settle_all();
  async_ = async;
  gathering_.assign(params_.size(), CommHandle());
}

void PartitionedParams::start_fetch(int64_t i) {
  if (live_[i]) return;
  const FlatLayout::Block& b = layout_.blocks[i];
  const Tensor& whole = gather_[i];
  chunk_in(i);
  whole.storage().reallocate(static_cast<size_t>(b.numel) * whole.itemsize());
  if (async_ != nullptr) {
    gathering_[i] = async_->all_gather(gather_source(i), whole);
  } else {
    try {
      dp_.all_gather(gather_source(i), whole);
    } catch (...) {
      chunk_sent(i);
      throw;
    }
    chunk_sent(i);
  }
  live_[i] = true;
  live_numel_ += layout_.params[i].numel;
  peak_live_numel_ = std::max(peak_live_numel_, live_numel_);
}

void PartitionedParams::settle(int64_t i) {
  if (async_ == nullptr) return;
  const CommHandle travelling = std::exchange(gathering_[i], CommHandle());
  travelling.wait();
  chunk_sent(i);
}

void PartitionedParams::gather_from_swapped_shard(TensorSwapper& swapper,
                                                  const std::vector<int64_t>& ids) {
  TS_INTERNAL_ASSERT(
      model_chunks_.empty() && chunk_swapper_ == nullptr && ids.size() == params_.size(),
      "an f32 shard swapped chunk by chunk, one per parameter");
  chunk_swapper_ = &swapper;
  chunk_ids_ = ids;
  gathers_read_masters_ = true;
}

void PartitionedParams::chunk_in(int64_t i) {
  // A master in memory (the step's, or brought in whole) is read where it is.
  if (chunk_ids_[i] < 0 || chunk_held_[i] || chunk_swapper_->resident(chunk_ids_[i])) return;
  chunk_swapper_->swap_in({chunk_ids_[i]});
  chunk_held_[i] = true;
}

void PartitionedParams::chunk_sent(int64_t i) {
  if (!chunk_held_[i]) return;
  chunk_swapper_->evict({chunk_ids_[i]});
  chunk_held_[i] = false;
}

void PartitionedParams::settle_all() {
  std::exception_ptr first;
  for (size_t i = 0; i < gathering_.size(); ++i) {
    try {
      settle(static_cast<int64_t>(i));
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void PartitionedParams::release(int64_t i) {
  settle(i);  // its storage may be the target of a travelling gather
  if (!live_[i] || persistent_[i]) return;
  gather_[i].storage().release();
  live_[i] = false;
  live_numel_ -= layout_.params[i].numel;
}

bool PartitionedParams::make_room(int64_t numel) {
  const int64_t bound = config_.stage3_max_live_parameters;
  for (size_t i = 0; i < params_.size() && live_numel_ + numel > bound; ++i) {
    if (forward_pins_[i] == 0 && !backward_pinned_[i]) release(static_cast<int64_t>(i));
  }
  return live_numel_ + numel <= bound;
}

void PartitionedParams::fetch_pinned(const Module& m, const std::vector<int64_t>& ids,
                                     bool backward) {
  int64_t need = 0;
  for (const int64_t i : ids) {
    if (backward) {
      backward_pinned_[i] = true;
    } else {
      ++forward_pins_[i];
    }
    if (!live_[i]) need += layout_.params[i].numel;
  }
  if (!make_room(need)) {
    const int64_t pinned = live_numel_;
    for (const int64_t i : ids) {
      if (!backward) --forward_pins_[i];
    }
    TS_CHECK(
        false, "[zero] stage 3: a call of the module holding \"", layout_.params[ids.front()].name,
        "\" needs ", need, " more gathered parameter elements while ", pinned,
        " are held by calls in progress; expected stage3_max_live_parameters >= ", need + pinned,
        ", found ", config_.stage3_max_live_parameters);
  }
  for (const int64_t i : ids) start_fetch(i);
  try {
    for (const int64_t i : ids) settle(i);
  } catch (...) {  // the call does not happen: its pins go
    for (const int64_t i : ids) {
      if (backward) {
        backward_pinned_[i] = false;
      } else {
        --forward_pins_[i];
      }
    }
    throw;
  }
}

void PartitionedParams::prefetch(int64_t from, int dir) {
  if (!trace_complete_) return;
  int64_t budget = config_.stage3_prefetch_bucket_size;
  for (int64_t pos = from; pos >= 0 && pos < static_cast<int64_t>(trace_.size()); pos += dir) {
    // The bucket bounds what is gathered ahead of use, whether gathered now or earlier.
    for (const int64_t i : params_of(*trace_[pos])) {
      const int64_t numel = layout_.params[i].numel;
      if (numel > budget) return;
      budget -= numel;
      if (live_[i]) continue;
      if (live_numel_ + numel > config_.stage3_max_live_parameters) return;
      start_fetch(i);
    }
  }
}

bool PartitionedParams::reused_soon(int64_t i, int64_t pos) {
  if (!trace_complete_ || pos < 0) return false;
  int64_t distance = 0;
  for (size_t q = static_cast<size_t>(pos) + 1; q < trace_.size(); ++q) {
    for (const int64_t j : params_of(*trace_[q])) {
      if (j == i) return distance <= config_.stage3_max_reuse_distance;
      distance += layout_.params[j].numel;
    }
  }
  return false;
}

void PartitionedParams::pre_forward(const Module& m) {
  const std::vector<int64_t>& ids = params_of(m);
  if (ids.empty()) return;
  // Follow (or record) the trace of training forwards; a call of the trace's first module
  // starts it over, any other surprise stops prefetching until then.
  const bool traced = !in_backward_ && GradMode::is_enabled();
  if (traced && !trace_complete_) {
    trace_.push_back(&m);
    forward_pos_ = static_cast<int64_t>(trace_.size()) - 1;
  } else if (traced) {
    const int64_t next = forward_pos_ + 1;
    if (next < static_cast<int64_t>(trace_.size()) && trace_[next] == &m) {
      forward_pos_ = next;
    } else {
      forward_pos_ = trace_.front() == &m ? 0 : -1;
    }
  }
  fetch_pinned(m, ids, false);
  if (traced && forward_pos_ >= 0) prefetch(forward_pos_ + 1, +1);
}

void PartitionedParams::post_forward(const Module& m) noexcept {
  const auto it = module_params_.find(&m);
  if (it == module_params_.end()) return;
  const bool traced = !in_backward_ && GradMode::is_enabled();
  for (const int64_t i : it->second) {
    --forward_pins_[i];
    if (forward_pins_[i] > 0 || backward_pinned_[i]) continue;
    if (!(traced && reused_soon(i, forward_pos_))) release(i);
  }
}

void PartitionedParams::pre_backward(const Module& m) {
  const std::vector<int64_t>& ids = params_of(m);
  if (ids.empty()) return;
  int64_t pos = -1;
  if (trace_complete_) {
    for (int64_t q = std::min(backward_pos_, static_cast<int64_t>(trace_.size()) - 1); q >= 0;
         --q) {
      if (trace_[q] == &m) {
        pos = q;
        break;
      }
    }
  }
  fetch_pinned(m, ids, true);
  if (pos >= 0) {
    backward_pos_ = pos - 1;
    prefetch(pos - 1, -1);
  }
}

void PartitionedParams::begin_backward() {
  trace_complete_ = trace_complete_ || !trace_.empty();
  in_backward_ = true;
  backward_pos_ = static_cast<int64_t>(trace_.size()) - 1;
}

void PartitionedParams::grad_ready(int64_t i) {
  backward_pinned_[i] = false;
  if (forward_pins_[i] == 0) release(i);
}

void PartitionedParams::end_backward() {
  in_backward_ = false;
  forward_pos_ = -1;
  std::exception_ptr failed;  // of a gather prefetched and not used: reported after the releases
  try {
    settle_all();
  } catch (...) {
    failed = std::current_exception();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    backward_pinned_[i] = false;
    if (forward_pins_[i] == 0) release(static_cast<int64_t>(i));
  }
  if (failed) std::rethrow_exception(failed);
}

Tensor PartitionedParams::source_chunk(int64_t i) const {
  return model_chunks_.empty() ? shard_[i] : model_chunks_[i];
}

Tensor PartitionedParams::gather_source(int64_t i) {
  const Tensor source = source_chunk(i);
  const Device device = params_[i].device();
  if (source.device() == device) return source;  // read by the gather itself
  // A host chunk (Note [Offload on a GPU] in zero_optimizer.h): its copy on the device is
  // what the gather sends, so a swapped chunk may go at once.
  const Tensor on_device = source.to(device);
  chunk_sent(i);
  return on_device;
}

void round_into(const Tensor& dst, const Tensor& master, const Tensor& staging) {
  if (staging.defined() && dst.device().is_cuda() && master.device().is_cpu()) {
    dst.copy_queued_(master, staging);
  } else {
    dst.copy_(master);
  }
}

void PartitionedParams::round_chunk(int64_t i, const Tensor& staging) {
  if (model_chunks_.empty()) return;  // f32: the shard is what the gathers send
  if (chunk_ids_[i] < 0) {
    round_into(model_chunks_[i], shard_[i], staging);
    return;
  }
  settle(i);                                 // no gather may be reading the chunk
  chunk_swapper_->discard({chunk_ids_[i]});  // rewritten whole: no read
  chunk_held_[i] = false;
  chunk_swapper_->swap_in({chunk_ids_[i]});
  model_chunks_[i].copy_(shard_[i]);
  chunk_swapper_->swap_out({chunk_ids_[i]});
}

void PartitionedParams::after_step() {
  NoGradGuard no_grad;
  settle_all();
  if (!model_chunks_.empty() && !rounded_in_step_) {  // rounds the f32 masters
    for (size_t i = 0; i < params_.size(); ++i) round_chunk(static_cast<int64_t>(i), Tensor());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (persistent_[i]) {
      const auto p = static_cast<int64_t>(i);
      chunk_in(p);
      dp_.all_gather(gather_source(p), gather_[i]);
      chunk_sent(p);
    } else {
      TS_CHECK(forward_pins_[i] == 0 && !backward_pinned_[i], "[zero] stage 3: parameter \"",
               layout_.params[i].name, "\" is in use by a module call during the step");
      release(static_cast<int64_t>(i));
    }
  }
}

void PartitionedParams::load(const std::vector<Tensor>& whole) {
  NoGradGuard no_grad;
  settle_all();
  TS_INTERNAL_ASSERT(whole.size() == params_.size(), "expected ", params_.size(),
                     " parameters, found ", whole.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    const FlatLayout::Block& b = layout_.blocks[i];
    const int64_t begin = dp_.rank() * b.chunk;  // this rank's chunk, clipped to the parameter
    const int64_t end = std::min(begin + b.chunk, p.numel);
    const Tensor& chunk = shard_[i];
    chunk.fill_(0.0);
    if (end > begin) {
      chunk.narrow(0, 0, end - begin)
          .copy_(whole[i].reshape({p.numel}).narrow(0, begin, end - begin));
    }
    if (persistent_[i]) {
      params_[i].copy_(whole[i]);
    } else {
      release(static_cast<int64_t>(i));
    }
  }
  if (!model_chunks_.empty()) {
    for (size_t i = 0; i < params_.size(); ++i) round_chunk(static_cast<int64_t>(i), Tensor());
  }
}

std::vector<Tensor> PartitionedParams::gather_all() {
  NoGradGuard no_grad;
  settle_all();
  std::vector<Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout_.params[i];
    const FlatLayout::Block& b = layout_.blocks[i];
    // On the parameters' device: the masters may be host memory (Note [Offload on a GPU]).
    const Device device = params_[i].device();
    const Tensor whole = empty({b.numel}, {DType::f32, device});
    dp_.all_gather(shard_[i].to(device), whole);
    out.push_back(whole.narrow(0, 0, p.numel).view(p.shape));
  }
  return out;
}

int64_t PartitionedParams::bytes() const {
  int64_t bytes = chunk_bytes();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (persistent_[i]) bytes += static_cast<int64_t>(gather_[i].nbytes());
  }
  return bytes;
}

int64_t PartitionedParams::chunk_bytes() const {
  if (model_shard_.defined()) return static_cast<int64_t>(model_shard_.nbytes());
  int64_t bytes = 0;
  for (const Tensor& c : model_chunks_) bytes += static_cast<int64_t>(c.storage().nbytes());
  return bytes;
}

int64_t PartitionedParams::host_chunk_bytes() const {
  if (params_.empty() || params_.front().device().is_cpu()) return 0;
  if (model_shard_.defined()) {
    return model_shard_.device().is_cpu() ? static_cast<int64_t>(model_shard_.nbytes()) : 0;
  }
  int64_t bytes = 0;
  for (const Tensor& c : model_chunks_) {
    if (c.device().is_cpu()) bytes += static_cast<int64_t>(c.storage().nbytes());
  }
  return bytes;
}

int64_t PartitionedParams::swapped_bytes() const {
  // A swapped f32 shard is the optimizer's file's, which counts it.
  return chunk_swapper_ != nullptr && !gathers_read_masters_ ? chunk_swapper_->swapped_bytes() : 0;
}

}  // namespace tessera::parallel
