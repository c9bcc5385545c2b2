#include "parallel/zero/parameter_store.h"

#include <algorithm>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera::parallel {
MasterWeights::MasterWeights(Communicator& dp, const FlatLayout& layout,
                             std::vector<Tensor>& params, DType dtype, Device device, bool sharded,
                             const optim::LossScalerConfig& scaler, bool host_masters)
    : dp_(dp), layout_(layout), params_(params), sharded_(sharded), device_(device) {
  NoGradGuard no_grad;
  const bool mixed = dtype != DType::f32;
  if (dtype == DType::f16) scaler_ = std::make_unique<optim::LossScaler>(scaler);
  TS_INTERNAL_ASSERT(!host_masters || (mixed && sharded), "host masters are sharded 16-bit ones");
  // Parameters become views of the flat buffer: of the 16-bit model buffer when mixed, with
  // the f32 masters whole in flat_params_ (stage 0) or sharded in master_chunks_.
  if (mixed) flat_model_ = zeros({layout.numel}, {dtype, device});
  chunks_rounded_in_step_ = host_masters;
  if (mixed && sharded) {
    for (const FlatLayout::Block& b : layout_.blocks) {
      master_chunks_.push_back(
          zeros({b.chunk}, {DType::f32, host_masters ? Device::cpu() : device}));
    }
  } else {
    flat_params_ = zeros({layout.numel}, {DType::f32, device});
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout.params[i];
    if (!mixed) {
      const Tensor view = flat_params_.narrow(0, p.offset, p.numel).view(p.shape);
      view.copy_(params_[i]);
      params_[i].set_data(view);
      continue;
    }
    const Tensor view = flat_model_.narrow(0, p.offset, p.numel).view(p.shape);
    view.copy_(params_[i]);
    params_[i].set_data(view);
    if (flat_params_.defined()) {
      masters_.push_back(flat_params_.narrow(0, p.offset, p.numel).view(p.shape));
    }
  }
  // Rank 0's values win; the masters start as the model's values, exactly.
  if (!mixed) {
    dp_.broadcast(flat_params_, 0);
    return;
  }
  dp_.broadcast(flat_model_, 0);
  if (flat_params_.defined()) {
    flat_params_.copy_(flat_model_);
    return;
  }
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const int64_t block = static_cast<int64_t>(b);
    own_chunk(block).copy_(
        flat_model_.narrow(0, layout_.chunk_offset(block, dp_.rank()), layout_.blocks[b].chunk));
  }
}

MasterWeights::~MasterWeights() {
  if (model_ != nullptr && model_->hooks() == hooks_) model_->set_hooks(nullptr);
}

class MasterWeights::ForwardWaits final : public ModuleHooks {
 public:
  explicit ForwardWaits(MasterWeights& store) : store_(store) {}
  void pre_forward(const Module& m) override { store_.settle_module(m); }
  void post_forward(const Module&) noexcept override {}
  void pre_backward(const Module& m) override { store_.settle_module(m); }

 private:
  MasterWeights& store_;
};

void MasterWeights::gather_in_background(AsyncCollectives* async, Module& model) {
  TS_INTERNAL_ASSERT(sharded_ && async != nullptr, "background gathers are for sharded masters");
  TS_CHECK(model.hooks() == nullptr,
           "[zero] overlap_comm at stage 1-2 waits for the parameters' gathers through the "
           "model's module hooks, and the model has hooks already (another optimizer's?); "
           "expected one optimizer with overlap_comm per model");
  async_ = async;
  model_ = &model;
  gathering_.assign(layout_.blocks.size(), CommHandle());
  for (size_t i = 0; i < params_.size(); ++i) {
    block_of_[params_[i].impl()] = layout_.params[i].block;
  }
  hooks_ = std::make_shared<ForwardWaits>(*this);
  model.set_hooks(hooks_);
}

void MasterWeights::settle_module(const Module& m) {
  auto [it, fresh] = module_blocks_.try_emplace(&m);
  if (fresh) {
    for (const Tensor& t : m.own_parameters()) {
      const auto found = block_of_.find(t.impl());
      if (found != block_of_.end()) it->second.push_back(found->second);
    }
  }
  for (const int64_t b : it->second) {
    if (gather_order_.empty() &&
        std::find(first_needed_.begin(), first_needed_.end(), b) == first_needed_.end()) {
      first_needed_.push_back(b);
    }
    CommHandle& h = gathering_[static_cast<size_t>(b)];
    h.wait();
    h = CommHandle();
  }
}

void MasterWeights::settle() {
  std::exception_ptr first;  // every handle is waited for and dropped, then it is rethrown
  for (CommHandle& h : gathering_) {
    try {
      h.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    h = CommHandle();
  }
  if (first) std::rethrow_exception(first);
}

void MasterWeights::agree_gather_order() {
  const std::vector<int64_t> mine = gather_order();
  const Tensor order =
      from_vector(mine, {static_cast<int64_t>(mine.size())}).to(device_);  // (blocks) i64
  dp_.broadcast(order, 0);
  gather_order_ = order.to(Device::cpu()).to_vector<int64_t>();
}

std::vector<int64_t> MasterWeights::gather_order() const {
  if (!gather_order_.empty()) return gather_order_;
  std::vector<int64_t> order = first_needed_;
  for (int64_t b = 0; b < static_cast<int64_t>(layout_.blocks.size()); ++b) {
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  }
  return order;
}

void MasterWeights::gather_block(int64_t block, const Tensor& in, const Tensor& out) {
  if (async_ != nullptr) {
    gathering_[static_cast<size_t>(block)] = async_->all_gather(in, out);
  } else {
    dp_.all_gather(in, out);
  }
}

Tensor MasterWeights::own_chunk(int64_t block) const {
  const FlatLayout::Block& b = layout_.blocks[block];
  if (!master_chunks_.empty()) return master_chunks_[static_cast<size_t>(block)];
  return flat_params_.narrow(0, layout_.chunk_offset(block, dp_.rank()), b.chunk);
}

const std::vector<Tensor>& MasterWeights::masters() const {
  TS_INTERNAL_ASSERT(master_chunks_.empty(), "sharded masters have no whole views");
  return masters_.empty() ? params_ : masters_;
}

void MasterWeights::after_step() { finish_step(/*rounded=*/false); }

void MasterWeights::after_rounding_step() { finish_step(/*rounded=*/true); }

std::vector<Tensor> MasterWeights::model_copies() const {
  std::vector<Tensor> out;
  if (!flat_model_.defined()) return out;
  if (master_chunks_.empty()) {
    for (const FlatLayout::Param& p : layout_.params) {
      out.push_back(flat_model_.narrow(0, p.offset, p.numel).view(p.shape));
    }
    return out;
  }
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const int64_t block = static_cast<int64_t>(b);
    out.push_back(
        flat_model_.narrow(0, layout_.chunk_offset(block, dp_.rank()), layout_.blocks[b].chunk));
  }
  return out;
}

void MasterWeights::finish_step(bool rounded) {
  settle();  // the last step's gathers have arrived (settle_communication waited already)
  if (async_ != nullptr && gather_order_.empty()) agree_gather_order();
  if (sharded_ && master_chunks_.empty()) {
    for (const int64_t b : gather_order()) {
      const FlatLayout::Block& blk = layout_.blocks[static_cast<size_t>(b)];
      // The input must not overlap the output.
      gather_block(b, own_chunk(b).clone(), flat_params_.narrow(0, blk.offset, blk.numel));
    }
  }
  update_model(rounded);
}

std::vector<Tensor> MasterWeights::whole() {
  if (master_chunks_.empty()) return masters();
  NoGradGuard no_grad;
  // On the host, one block at a time on the device: the device never holds the whole
  // masters that sharding saves it.
  const Tensor all = empty({layout_.numel}, {DType::f32, Device::cpu()});
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const FlatLayout::Block& blk = layout_.blocks[b];
    const Tensor gathered = empty({blk.numel}, {DType::f32, device_});
    dp_.all_gather(own_chunk(static_cast<int64_t>(b)).to(device_), gathered);  // host masters
    all.narrow(0, blk.offset, blk.numel).copy_(gathered);
  }
  std::vector<Tensor> out;
  for (const FlatLayout::Param& p : layout_.params) {
    out.push_back(all.narrow(0, p.offset, p.numel).view(p.shape));
  }
  return out;
}

void MasterWeights::load(const std::vector<Tensor>& whole) {
  NoGradGuard no_grad;
  settle();  // no gather may still write the parameters
  if (master_chunks_.empty()) {
    const std::vector<Tensor>& targets = masters();
    for (size_t i = 0; i < whole.size(); ++i) targets[i].copy_(whole[i]);
    round_into_model();
    return;
  }
  // Every rank has the whole values: its master chunks take them in f32, the model rounded.
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < whole.size(); ++i) {
    named.emplace_back(layout_.params[i].name, whole[i]);
    params_[i].copy_(whole[i]);
  }
  const Tensor mine = parallel::shard(layout_, dp_.rank(), named);  // (layout.shard_numel())
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const FlatLayout::Block& blk = layout_.blocks[b];
    master_chunks_[b].copy_(mine.narrow(0, blk.shard_offset, blk.chunk));
  }
}

void MasterWeights::round_chunks_in_step() {
  TS_INTERNAL_ASSERT(!master_chunks_.empty(), "only sharded masters are rounded in the step");
  chunks_rounded_in_step_ = true;
}

void MasterWeights::round_chunk(int64_t block, const Tensor& staging) {
  const FlatLayout::Block& blk = layout_.blocks[static_cast<size_t>(block)];
  round_into(flat_model_.narrow(0, layout_.chunk_offset(block, dp_.rank()), blk.chunk),
             own_chunk(block), staging);
}

void MasterWeights::round_into_model() { update_model(/*rounded=*/false); }

void MasterWeights::update_model(bool rounded) {
  if (!flat_model_.defined()) return;
  if (master_chunks_.empty()) {
    if (!rounded) flat_model_.copy_(flat_params_);
    return;
  }
  for (const int64_t block : gather_order()) {
    const FlatLayout::Block& blk = layout_.blocks[static_cast<size_t>(block)];
    const Tensor mine = flat_model_.narrow(0, layout_.chunk_offset(block, dp_.rank()), blk.chunk);
    if (!rounded && !chunks_rounded_in_step_) round_chunk(block, Tensor());
    // 16 bits on the wire; the input must not overlap the output.
    gather_block(block, mine.clone(), flat_model_.narrow(0, blk.offset, blk.numel));
  }
}

int64_t MasterWeights::bytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&flat_params_, &flat_model_}) {
    if (t->defined()) n += static_cast<int64_t>(t->nbytes());
  }
  for (const Tensor& t : master_chunks_) n += static_cast<int64_t>(t.storage().nbytes());
  return n;
}

PartitionedWeights::PartitionedWeights(Communicator& dp, const FlatLayout& layout,
                                       const std::vector<Tensor>& params, Module& model,
                                       const ZeroConfig& config, const ParameterInit& init,
                                       const ShardOffload& offload)
    : layout_(layout), model_(model) {
  TensorSwapper* swapper = offload.masters;
  const bool host_masters = offload.host_masters;
  // f32 on the parameters' device (CPU or CUDA: Note [ZeRO-3 parameters]), or the host's.
  const Device device = params.empty() ? Device::cpu() : params.front().device();
  const bool half = !params.empty() && is_half(params.front().dtype());
  TS_INTERNAL_ASSERT(!host_masters || half, "host masters are 16-bit parameters' ones");
  ShardWrites writes;
  if (swapper == nullptr) {
    shard_ = zeros({layout.shard_numel()}, {DType::f32, host_masters ? Device::cpu() : device});
    for (const FlatLayout::Block& b : layout.blocks) {
      chunks_.push_back(shard_.narrow(0, b.shard_offset, b.chunk));
    }
  } else {
    TS_CHECK(device.is_cpu() || (host_masters && half),
             "[zero] stage 3 swaps the f32 shard of host parameters, or the host masters of "
             "16-bit ones; found ",
             params.empty() ? std::string("none") : params.front().str());
    // Each chunk is in memory only while construction writes it.
    for (const FlatLayout::Block& b : layout.blocks) {
      int64_t id = 0;
      chunks_.push_back(swapper->add_zeros(b.chunk, id));
      swap_ids_.push_back(id);
    }
    writes.before = [this, swapper](int64_t i) { swapper->swap_in({swap_ids_[i]}); };
    writes.after = [this, swapper](int64_t i) { swapper->swap_out({swap_ids_[i]}); };
  }
  partitioned_ =
      std::make_shared<PartitionedParams>(dp, layout, params, chunks_, config, init, writes,
                                          offload.chunks, offload.host_chunks, offload.pin_chunks);
  if (swapper != nullptr || host_masters) partitioned_->round_chunks_in_step();
  // f32 parameters gather from their swapped shard (Note [Offloaded parameters]).
  if (swapper != nullptr && !half) partitioned_->gather_from_swapped_shard(*swapper, swap_ids_);
  model_.set_hooks(partitioned_);
}

PartitionedWeights::~PartitionedWeights() { model_.set_hooks(nullptr); }

Tensor PartitionedWeights::own_chunk(int64_t block) const {
  return chunks_[static_cast<size_t>(block)];
}

int64_t PartitionedWeights::bytes() const {
  int64_t n = partitioned_->bytes();
  if (shard_.defined()) return n + static_cast<int64_t>(shard_.nbytes());
  for (const Tensor& c : chunks_) n += static_cast<int64_t>(c.storage().nbytes());
  return n;
}

}  // namespace tessera::parallel
