#include "parallel/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "autograd/engine.h"
#include "autograd/record.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"

namespace tessera::parallel {
namespace {

std::string chunk_name(int64_t block) { return "zero_block_" + std::to_string(block); }

// The state kind of an optimizer state key "<kind>.<name>".
std::string kind_of(const std::string& key) { return key.substr(0, key.find('.')); }

}  // namespace

ZeroOptimizer::ZeroOptimizer(Communicator& dp, Module& model, std::vector<optim::ParamGroup> groups,
                             const optim::OptimizerConfig& optimizer, const ZeroConfig& zero,
                             const MixedPrecision& precision)
    : dp_(dp), model_(model), config_(zero), precision_(precision), groups_(std::move(groups)) {
  TS_CHECK(config_.stage >= 0 && config_.stage <= 3, "[zero] expected stage 0 to 3, found ",
           config_.stage);
  TS_CHECK(config_.stage == 0 || optimizer.type != optim::OptimizerType::lamb,
           "[zero] LAMB's trust ratio needs each parameter whole; expected stage 0 with LAMB, "
           "found stage ",
           config_.stage);
  TS_CHECK(config_.stage == 0 || !optim::is_onebit(optimizer.type),
           "[zero] the 1-bit optimizers are not compatible with ZeRO (as in DeepSpeed); expected "
           "stage 0, found stage ",
           config_.stage);
  const DType dtype = precision_.dtype;
  TS_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
           "[zero] expected a parameter precision of f32, f16 or bf16, found ", dtype_name(dtype));
  NoGradGuard no_grad;
  std::vector<FlatParamInfo> infos;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const NamedParameter& p : groups_[g].params) {
      const Tensor& t = p.tensor;
      if (params_.empty()) device_ = t.device();
      TS_CHECK(
          t.dtype() == dtype && t.device() == device_ && t.is_contiguous() && t.requires_grad(),
          "[zero] parameter \"", p.name, "\": expected a contiguous ", dtype_name(dtype),
          " tensor on ", device_.str(), " that requires grad, found ", t.str());
      infos.push_back({p.name, t.shape(), static_cast<int>(g)});
      params_.push_back(t);
    }
  }
  TS_CHECK(config_.stage < 3 || (dtype == DType::f32 && device_.is_cpu()),
           "[zero] stage 3 partitions f32 parameters on the CPU; expected f32 CPU parameters, "
           "found ",
           dtype_name(dtype), " on ", device_.str());
  const bool mixed = dtype != DType::f32;
  const TensorOptions f32{DType::f32, device_};
  if (dtype == DType::f16) scaler_ = std::make_unique<optim::LossScaler>(precision_.scaler);
  // Stage 3 gives every parameter a block of its own (Note [ZeRO-3 parameters]).
  layout_ = make_flat_layout(infos, dp_.size(), config_.stage == 3 ? 1 : config_.block_numel());

  if (config_.stage == 3) {
    param_shard_ = zeros({layout_.shard_numel()});
    partitioned_ =
        std::make_shared<PartitionedParams>(dp_, layout_, params_, param_shard_, config_);
    model_.set_hooks(partitioned_);
  } else {
    // Parameters become views of the flat buffer (of the 16-bit model buffer when mixed,
    // with the f32 masters in flat_params_); rank 0's values win.
    flat_params_ = zeros({layout_.numel}, f32);
    if (mixed) flat_model_ = zeros({layout_.numel}, {dtype, device_});
    for (size_t i = 0; i < params_.size(); ++i) {
      const FlatLayout::Param& p = layout_.params[i];
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
    if (mixed) flat_model_.copy_(flat_params_);
  }

  if (config_.stage <= 1) {
    flat_grads_ = zeros({layout_.numel}, f32);
    if (mixed) flat_model_grads_ = zeros({layout_.numel}, {dtype, device_});
  } else {
    grad_shard_ = zeros({layout_.shard_numel()}, f32);
  }
  if (config_.stage == 0 && mixed) {
    // The optimizer steps the masters, under the parameters' names, with f32 gradients.
    std::vector<optim::ParamGroup> master_groups = groups_;
    size_t i = 0;
    for (optim::ParamGroup& g : master_groups) {
      for (NamedParameter& p : g.params) {
        const FlatLayout::Param& lp = layout_.params[i];
        p.tensor = masters_[i++];
        p.tensor.set_grad(flat_grads_.narrow(0, lp.offset, lp.numel).view(lp.shape));
      }
    }
    inner_ = make_inner(optimizer, std::move(master_groups));
  } else if (config_.stage == 0) {
    inner_ = make_inner(optimizer, groups_);
  } else {
    // One optimizer parameter per owned chunk, in its block's group.
    std::vector<optim::ParamGroup> chunks;
    for (const optim::ParamGroup& g : groups_) chunks.push_back({{}, g.lr, g.weight_decay});
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      const int64_t block = static_cast<int64_t>(b);
      Tensor chunk = own_param_chunk(block);
      chunk.set_grad(own_grad_chunk(block));
      chunks[layout_.blocks[b].group].params.push_back({chunk_name(block), chunk, {}});
    }
    inner_ = optim::make_optimizer(optimizer, std::move(chunks));
  }
  pending_.assign(layout_.blocks.size(), 0);
  reduced_.assign(layout_.blocks.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    register_post_accumulate_hook(params_[i],
                                  [this, i](Tensor&) { on_grad_ready(static_cast<int64_t>(i)); });
  }
  zero_grad();
}

std::unique_ptr<optim::Optimizer> ZeroOptimizer::make_inner(const optim::OptimizerConfig& config,
                                                            std::vector<optim::ParamGroup> groups) {
  if (!optim::is_onebit(config.type)) return optim::make_optimizer(config, std::move(groups));
  std::unique_ptr<OneBitOptimizer> onebit = make_onebit_optimizer(config, std::move(groups), dp_);
  onebit_ = onebit.get();
  return onebit;
}

ZeroOptimizer::~ZeroOptimizer() {
  // The hooks capture `this`: make them inert, as the parameters may outlive us. Stage 3's
  // parameters stay as they are: partitioned, with their values in our shard.
  for (Tensor& p : params_) {
    if (AutogradMeta* m = p.autograd_meta()) m->post_accumulate_hooks.clear();
  }
  if (partitioned_) model_.set_hooks(nullptr);
}

Tensor ZeroOptimizer::own_param_chunk(int64_t block) const {
  const FlatLayout::Block& b = layout_.blocks[block];
  return config_.stage == 3
             ? param_shard_.narrow(0, b.shard_offset, b.chunk)
             : flat_params_.narrow(0, layout_.chunk_offset(block, dp_.rank()), b.chunk);
}

Tensor ZeroOptimizer::own_grad_chunk(int64_t block) const {
  const FlatLayout::Block& b = layout_.blocks[block];
  return config_.stage >= 2
             ? grad_shard_.narrow(0, b.shard_offset, b.chunk)
             : flat_grads_.narrow(0, layout_.chunk_offset(block, dp_.rank()), b.chunk);
}

void ZeroOptimizer::zero_grad() {
  NoGradGuard no_grad;
  overflow_ = false;
  if (config_.stage <= 1) {
    flat_grads_.fill_(0.0);
    const Tensor& model_grads = flat_model_grads_.defined() ? flat_model_grads_ : flat_grads_;
    if (flat_model_grads_.defined()) flat_model_grads_.fill_(0.0);
    // Backward accumulates into these views in place (AccumulateGrad).
    for (size_t i = 0; i < params_.size(); ++i) {
      const FlatLayout::Param& p = layout_.params[i];
      params_[i].set_grad(model_grads.narrow(0, p.offset, p.numel).view(p.shape));
    }
  } else {
    grad_shard_.fill_(0.0);
    for (Tensor& p : params_) p.set_grad(Tensor());
  }
}

void ZeroOptimizer::backward(const Tensor& loss, double scale, bool boundary) {
  reducing_ = config_.stage >= 2 || boundary;
  const bool from_hooks = config_.stage >= 2 || config_.overlap_comm;
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    pending_[b] = layout_.blocks[b].end_param - layout_.blocks[b].first_param;
    reduced_[b] = false;
  }
  in_backward_ = reducing_ && from_hooks;
  if (partitioned_) partitioned_->begin_backward();
  try {
    const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
    tessera::backward(loss, scalar_tensor(scale * loss_scale, {loss.dtype(), loss.device()}));
  } catch (...) {
    in_backward_ = false;
    if (partitioned_) partitioned_->end_backward();
    throw;
  }
  in_backward_ = false;
  if (partitioned_) partitioned_->end_backward();
  if (!reducing_) return;
  // Blocks the hooks did not reduce: all of them without overlap, and any block with a
  // parameter that got no gradient. Every rank takes them in the same order.
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    if (!reduced_[b]) reduce_block(static_cast<int64_t>(b));
  }
}

void ZeroOptimizer::backward_unreduced(const Tensor& root, const Tensor& grad) {
  TS_CHECK(config_.stage <= 1, "[zero] pipeline backward needs ZeRO stage 0 or 1, found stage ",
           config_.stage, " (it reduces during backward, before the tied gradients are summed)");
  reducing_ = false;
  in_backward_ = false;
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const Tensor seed =
      loss_scale == 1.0 ? grad
                        : kernels::binary(kernels::BinaryOp::mul, grad,
                                          scalar_tensor(loss_scale, {grad.dtype(), grad.device()}));
  tessera::backward(root, seed);
}

void ZeroOptimizer::reduce_gradients() {
  TS_CHECK(config_.stage <= 1, "[zero] reduce_gradients is for stages 0-1, found stage ",
           config_.stage);
  for (size_t b = 0; b < layout_.blocks.size(); ++b) reduce_block(static_cast<int64_t>(b));
}

void ZeroOptimizer::set_model_parallel_norm(Communicator& group, std::set<std::string> duplicates) {
  norm_group_ = &group;
  counted_.clear();  // empty: every parameter counts
  if (!duplicates.empty()) {
    counted_.assign(params_.size(), true);
    for (size_t i = 0; i < params_.size(); ++i) {
      counted_[i] = duplicates.erase(layout_.params[i].name) == 0;
    }
  }
  TS_CHECK(duplicates.empty(), "[zero] set_model_parallel_norm: ", *duplicates.begin(),
           " is not a parameter of this optimizer");
}

void ZeroOptimizer::on_grad_ready(int64_t param) {
  if (!in_backward_) return;
  const int64_t block = layout_.params[param].block;
  if (--pending_[block] == 0) reduce_block(block);
  if (partitioned_) partitioned_->grad_ready(param);
}

void ZeroOptimizer::reduce_block(int64_t block) {
  NoGradGuard no_grad;
  const FlatLayout::Block& b = layout_.blocks[block];
  const double inv_world = 1.0 / dp_.size();
  reduced_[block] = true;
  if (config_.stage <= 1 && flat_model_grads_.defined()) {
    // The 16-bit gradients become f32 before they are reduced (Note [Mixed precision]).
    flat_grads_.narrow(0, b.offset, b.numel).copy_(flat_model_grads_.narrow(0, b.offset, b.numel));
  }
  if (config_.stage == 0) {
    if (!full_precision_reduction()) return;  // the 1-bit optimizer takes local gradients
    const Tensor view = flat_grads_.narrow(0, b.offset, b.numel);
    dp_.all_reduce(view);
    if (dp_.size() > 1) kernels::scale_(view, inv_world);  // x 1 would be a pass for nothing
    return;
  }
  Tensor buffer;
  if (config_.stage == 1) {
    buffer = flat_grads_.narrow(0, b.offset, b.numel);
  } else {
    // Stages 2-3: gather the block's gradients into one buffer and drop them. Every element
    // is written once: a gradient, or zero (padding, a parameter backward did not reach).
    buffer = empty({b.numel}, {DType::f32, device_});
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
  }
  Tensor reduced;
  if (config_.reduce_scatter) {
    reduced = empty({b.chunk}, {DType::f32, device_});
    dp_.reduce_scatter(buffer, reduced);
  } else {
    dp_.all_reduce(buffer);
    reduced = buffer.narrow(0, dp_.rank() * b.chunk, b.chunk);
  }
  const Tensor own = own_grad_chunk(block);
  if (config_.stage == 1) {
    if (reduced.raw_data() != own.raw_data()) own.copy_(reduced);
    if (dp_.size() > 1) kernels::scale_(own, inv_world);
  } else {
    kernels::axpy_(own, reduced, inv_world);  // accumulates over micro-batches
  }
}

double ZeroOptimizer::counted_squared_norm() const {
  const bool all = counted_.empty();
  double sq = 0.0;
  if (config_.stage == 0) {
    if (all) return kernels::squared_norm(flat_grads_);
    for (size_t i = 0; i < params_.size(); ++i) {
      const FlatLayout::Param& p = layout_.params[i];
      if (counted_[i]) sq += kernels::squared_norm(flat_grads_.narrow(0, p.offset, p.numel));
    }
    return sq;
  }
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const Tensor own = own_grad_chunk(static_cast<int64_t>(b));
    if (all) {
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
      if (counted_[i] && end > begin) {
        sq += kernels::squared_norm(own.narrow(0, begin - chunk_begin, end - begin));
      }
    }
  }
  return sq;
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  NoGradGuard no_grad;
  double sq = counted_squared_norm();  // stage 0: identical on every rank of dp
  if (config_.stage > 0 || norm_group_ != nullptr) {
    // On the parameters' device: an NCCL group moves device tensors only.
    const Tensor total = scalar_tensor(sq, {DType::f64, device_});
    if (config_.stage > 0) dp_.all_reduce(total);
    if (norm_group_ != nullptr) norm_group_->all_reduce(total);
    sq = total.item<double>();
  }
  // The gradients carry the loss scale (1 without f16): unscale and clip in one multiply.
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const double norm = std::sqrt(sq) / loss_scale;
  overflow_ = scaler_ != nullptr && !std::isfinite(norm);
  if (scaler_ && !full_precision_reduction()) {
    // Local gradients: every rank must agree on skipping the step, or the ones that step
    // would wait in the 1-bit all-reduce for the ones that do not.
    const Tensor any = scalar_tensor(overflow_ ? 1.0 : 0.0, {DType::f32, device_});
    dp_.all_reduce(any, ReduceOp::max);
    overflow_ = any.item<float>() > 0.0f;
  }
  if (overflow_) return norm;
  double factor = 1.0 / loss_scale;
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0.0 && std::isfinite(norm) && coef < 1.0) factor *= coef;
  if (factor != 1.0) {
    if (config_.stage == 0) {
      kernels::scale_(flat_grads_, factor);
    } else {
      for (size_t b = 0; b < layout_.blocks.size(); ++b) {
        kernels::scale_(own_grad_chunk(static_cast<int64_t>(b)), factor);
      }
    }
  }
  return norm;
}

bool ZeroOptimizer::step() {
  NoGradGuard no_grad;
  if (scaler_) {
    scaler_->update(overflow_);
    if (overflow_) return false;  // DeepSpeed skips the step and keeps the parameters
  }
  inner_->step();
  if (partitioned_) {
    partitioned_->after_step();
    return true;
  }
  if (config_.stage == 0) {
    if (flat_model_.defined()) flat_model_.copy_(flat_params_);
    return true;
  }
  for (size_t b = 0; b < layout_.blocks.size(); ++b) {
    const int64_t block = static_cast<int64_t>(b);
    const FlatLayout::Block& blk = layout_.blocks[b];
    // The input must not overlap the output.
    dp_.all_gather(own_param_chunk(block).clone(), flat_params_.narrow(0, blk.offset, blk.numel));
  }
  if (flat_model_.defined()) flat_model_.copy_(flat_params_);
  return true;
}

bool ZeroOptimizer::full_precision_reduction() const {
  return onebit_ == nullptr || onebit_->reduce_gradients_next();
}

StateDict ZeroOptimizer::rank_state() const {
  return onebit_ != nullptr ? onebit_->rank_state() : StateDict{};
}

void ZeroOptimizer::load_rank_state(const StateDict& saved) {
  TS_CHECK(onebit_ != nullptr || saved.empty(), "[zero] ", inner_->name(),
           " keeps no per-rank state; expected none, found \"", saved.front().first, "\"");
  if (onebit_ == nullptr) return;
  NoGradGuard no_grad;
  onebit_->load_rank_state(saved);
  if (flat_model_.defined()) flat_model_.copy_(flat_params_);  // 0/1 Adam's local parameters
}

void ZeroOptimizer::reset_rank_state() {
  if (onebit_ == nullptr) return;
  NoGradGuard no_grad;
  onebit_->reset_rank_state();
}

void ZeroOptimizer::set_lr(double lr) { inner_->set_lr(lr); }
double ZeroOptimizer::lr() const { return inner_->lr(); }
bool ZeroOptimizer::set_momentum(double beta1) { return inner_->set_momentum(beta1); }
int64_t ZeroOptimizer::step_count() const { return inner_->step_count(); }

ModelStateBytes ZeroOptimizer::model_state_bytes() const {
  ModelStateBytes m;
  m.params = partitioned_
                 ? static_cast<int64_t>(param_shard_.nbytes()) + partitioned_->persistent_bytes()
                 : static_cast<int64_t>(flat_params_.nbytes());
  m.grads = static_cast<int64_t>(config_.stage <= 1 ? flat_grads_.nbytes() : grad_shard_.nbytes());
  if (flat_model_.defined()) m.params += static_cast<int64_t>(flat_model_.nbytes());
  if (flat_model_grads_.defined()) m.grads += static_cast<int64_t>(flat_model_grads_.nbytes());
  for (const auto& [key, t] : inner_->state_dict()) {
    if (key != "step") m.optimizer += static_cast<int64_t>(t.nbytes());
  }
  return m;
}

StateDict ZeroOptimizer::state_dict() const {
  StateDict inner = inner_->state_dict();
  if (!sharded()) return inner;
  NoGradGuard no_grad;
  // Chunk states "<kind>.zero_block_<b>" -> one shard tensor per kind; the chunks tile it.
  StateDict out;
  std::vector<std::string> kinds;
  const std::map<std::string, Tensor> by_key(inner.begin(), inner.end());
  for (const auto& [key, t] : inner) {
    if (key == "step") {
      out.emplace_back(key, t);
    } else if (std::find(kinds.begin(), kinds.end(), kind_of(key)) == kinds.end()) {
      kinds.push_back(kind_of(key));
    }
  }
  for (const std::string& kind : kinds) {
    const Tensor shard = empty({layout_.shard_numel()});
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      const FlatLayout::Block& blk = layout_.blocks[b];
      shard.narrow(0, blk.shard_offset, blk.chunk)
          .copy_(by_key.at(kind + "." + chunk_name(static_cast<int64_t>(b))));
    }
    out.emplace_back(kind, shard);
  }
  return out;
}

StateDict ZeroOptimizer::whole_state_dict() const {
  if (!sharded()) return state_dict();
  NoGradGuard no_grad;
  const StateDict mine = state_dict();
  std::vector<StateDict> shards(static_cast<size_t>(dp_.size()));
  for (const auto& [key, t] : mine) {
    if (key == "step") {
      for (StateDict& s : shards) s.emplace_back(key, t);
      continue;
    }
    const Tensor all = empty({t.numel() * dp_.size()}, {t.dtype(), device_});
    dp_.all_gather(t.to(device_).contiguous(), all);
    for (int r = 0; r < dp_.size(); ++r) {
      shards[r].emplace_back(key, all.narrow(0, r * t.numel(), t.numel()).to(Device::cpu()));
    }
  }
  return whole_state(layout_, shards);
}

void ZeroOptimizer::load_whole_state(const StateDict& whole) {
  if (!sharded()) {
    inner_->load_state_dict(whole);
    return;
  }
  NoGradGuard no_grad;
  // Group "<kind>.<parameter>" by kind, then shard each kind for this rank.
  std::map<std::string, std::vector<std::pair<std::string, Tensor>>> by_kind;
  StateDict chunks;
  for (const auto& [key, t] : whole) {
    if (key == "step") {
      chunks.emplace_back(key, t);
      continue;
    }
    const size_t dot = key.find('.');
    TS_CHECK(dot != std::string::npos, "[zero] optimizer state \"", key,
             "\": expected <kind>.<parameter name>");
    by_kind[key.substr(0, dot)].emplace_back(key.substr(dot + 1), t);
  }
  for (const auto& [kind, tensors] : by_kind) {
    TS_CHECK(tensors.size() == layout_.params.size(), "[zero] optimizer state \"", kind,
             "\": expected one tensor per parameter (", layout_.params.size(), "), found ",
             tensors.size());
    const Tensor s = shard(layout_, dp_.rank(), tensors);
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      const FlatLayout::Block& blk = layout_.blocks[b];
      chunks.emplace_back(kind + "." + chunk_name(static_cast<int64_t>(b)),
                          s.narrow(0, blk.shard_offset, blk.chunk));
    }
  }
  inner_->load_state_dict(chunks);
}

StateDict ZeroOptimizer::whole_parameters() {
  StateDict out;
  const std::vector<Tensor> values = partitioned_        ? partitioned_->gather_all()
                                     : !masters_.empty() ? masters_
                                                         : params_;
  for (size_t i = 0; i < values.size(); ++i) out.emplace_back(layout_.params[i].name, values[i]);
  return out;
}

Tensor ZeroOptimizer::parameter_shard() const {
  TS_CHECK(partitioned_ != nullptr, "[zero] parameter_shard() is for stage 3; this is stage ",
           config_.stage);
  return param_shard_;
}

void ZeroOptimizer::load_parameters(const StateDict& whole) {
  std::map<std::string, Tensor> given(whole.begin(), whole.end());
  std::vector<Tensor> ordered;
  for (const FlatLayout::Param& p : layout_.params) {
    const auto it = given.find(p.name);
    TS_CHECK(it != given.end(), "[zero] expected a value for parameter \"", p.name,
             "\", found none");
    TS_CHECK(it->second.shape() == p.shape && it->second.dtype() == DType::f32,
             "[zero] parameter \"", p.name, "\": expected f32 ", shape_str(p.shape), ", found ",
             it->second.str());
    ordered.push_back(it->second);
    given.erase(it);
  }
  TS_CHECK(given.empty(), "[zero] unexpected tensor \"", given.empty() ? "" : given.begin()->first,
           "\"; expected only the model's trainable parameters");
  if (partitioned_) {
    partitioned_->load(ordered);
    return;
  }
  NoGradGuard no_grad;
  const std::vector<Tensor>& targets = masters_.empty() ? params_ : masters_;
  for (size_t i = 0; i < ordered.size(); ++i) targets[i].copy_(ordered[i]);
  if (flat_model_.defined()) flat_model_.copy_(flat_params_);
}

StateDict whole_state(const FlatLayout& layout, const std::vector<StateDict>& shards) {
  TS_CHECK(static_cast<int>(shards.size()) == layout.world, "[zero] expected ", layout.world,
           " optimizer shards, found ", shards.size());
  StateDict out;
  std::map<std::string, std::vector<Tensor>> kinds;
  std::set<std::string> first_keys;
  for (size_t r = 0; r < shards.size(); ++r) {
    std::set<std::string> keys;
    for (const auto& [key, t] : shards[r]) {
      keys.insert(key);
      if (key == "step") {
        if (r == 0) out.emplace_back(key, t);
        TS_CHECK(t.numel() == 1 && t.item<int64_t>() == out.front().second.item<int64_t>(),
                 "[zero] optimizer shard ", r, " is at step ", t.item<int64_t>(),
                 "; expected step ", out.front().second.item<int64_t>(), " like shard 0");
      } else {
        kinds[key].push_back(t);
      }
    }
    if (r == 0) first_keys = keys;
    TS_CHECK(keys == first_keys && keys.count("step") == 1, "[zero] optimizer shard ", r,
             " holds different state kinds than shard 0; expected the same kinds and a step");
  }
  for (const auto& [kind, ts] : kinds) {
    for (auto& [name, t] : unshard(layout, ts)) out.emplace_back(kind + "." + name, t);
  }
  return out;
}

}  // namespace tessera::parallel
