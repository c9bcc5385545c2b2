#include "parallel/zero/parameter_store.h"

#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera::parallel {

MasterWeights::MasterWeights(Communicator& dp, const FlatLayout& layout,
                             std::vector<Tensor>& params, DType dtype, Device device, bool sharded,
                             const optim::LossScalerConfig& scaler)
    : dp_(dp), layout_(layout), params_(params), sharded_(sharded) {
  NoGradGuard no_grad;
  const bool mixed = dtype != DType::f32;
  if (dtype == DType::f16) scaler_ = std::make_unique<optim::LossScaler>(scaler);
  // Parameters become views of the flat buffer (of the 16-bit model buffer when mixed, with
  // the f32 masters in flat_params_); rank 0's values win.
  flat_params_ = zeros({layout.numel}, {DType::f32, device});
  if (mixed) flat_model_ = zeros({layout.numel}, {dtype, device});
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatLayout::Param& p = layout.params[i];
    const Tensor master = flat_params_.narrow(0, p.offset, p.numel).view(p.shape);
    master.copy_(params_[i]);
    if (mixed) {
      masters_.push_back(master);
      params_[i].set_data(flat_model_.narrow(0, p.offset, p.numel).view(p.shape));
    } else {
      params_[i].set_data(master);
    }
  }
  dp_.broadcast(flat_params_, 0);
  round_into_model();
}

Tensor MasterWeights::own_chunk(int64_t block) const {
  return flat_params_.narrow(0, layout_.chunk_offset(block, dp_.rank()),
                             layout_.blocks[block].chunk);
}

void MasterWeights::after_step() {
  if (sharded_) {
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      const FlatLayout::Block& blk = layout_.blocks[b];
      // The input must not overlap the output.
      dp_.all_gather(own_chunk(static_cast<int64_t>(b)).clone(),
                     flat_params_.narrow(0, blk.offset, blk.numel));
    }
  }
  round_into_model();
}

void MasterWeights::load(const std::vector<Tensor>& whole) {
  NoGradGuard no_grad;
  const std::vector<Tensor>& targets = masters();
  for (size_t i = 0; i < whole.size(); ++i) targets[i].copy_(whole[i]);
  round_into_model();
}

void MasterWeights::round_into_model() {
  if (flat_model_.defined()) flat_model_.copy_(flat_params_);
}

int64_t MasterWeights::bytes() const {
  int64_t n = static_cast<int64_t>(flat_params_.nbytes());
  if (flat_model_.defined()) n += static_cast<int64_t>(flat_model_.nbytes());
  return n;
}

PartitionedWeights::PartitionedWeights(Communicator& dp, const FlatLayout& layout,
                                       const std::vector<Tensor>& params, Module& model,
                                       const ZeroConfig& config)
    : layout_(layout), model_(model) {
  shard_ = zeros({layout.shard_numel()});
  partitioned_ = std::make_shared<PartitionedParams>(dp, layout, params, shard_, config);
  model_.set_hooks(partitioned_);
}

PartitionedWeights::~PartitionedWeights() { model_.set_hooks(nullptr); }

Tensor PartitionedWeights::own_chunk(int64_t block) const {
  const FlatLayout::Block& b = layout_.blocks[block];
  return shard_.narrow(0, b.shard_offset, b.chunk);
}

int64_t PartitionedWeights::bytes() const {
  return static_cast<int64_t>(shard_.nbytes()) + partitioned_->persistent_bytes();
}

}  // namespace tessera::parallel
