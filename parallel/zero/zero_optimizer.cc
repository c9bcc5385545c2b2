#include "parallel/zero/zero_optimizer.h"

#include <cmath>
#include <exception>
#include <functional>
#include <set>
#include <utility>

#include "autograd/record.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "parallel/compression/onebit_config.h"
#include "parallel/zero/zero_state.h"

namespace tessera::parallel {

ZeroOptimizer::ZeroOptimizer(Communicator& dp, Module& model, std::vector<optim::ParamGroup> groups,
                             const optim::OptimizerConfig& optimizer, const ZeroConfig& zero,
                             const MixedPrecision& precision, const ParameterInit& init,
                             const ExpertParameters& experts)
    : ZeroOptimizer(dp, model, std::move(groups), optimizer, zero, precision, init, experts, 0) {}

ZeroOptimizer::ZeroOptimizer(Communicator& dp, Module& model, std::vector<optim::ParamGroup> groups,
                             const optim::OptimizerConfig& optimizer, const ZeroConfig& zero,
                             const MixedPrecision& precision, const ParameterInit& init,
                             const ExpertParameters& experts, int mean_over)
    : dp_(dp),
      model_(model),
      config_(zero),
      precision_(precision),
      groups_(std::move(groups)),
      mean_over_(mean_over) {
  TS_CHECK(config_.stage >= 0 && config_.stage <= 3, "[zero] expected stage 0 to 3, found ",
           config_.stage);
  TS_CHECK(config_.stage == 0 || optimizer.type != optim::OptimizerType::lamb,
           "[zero] LAMB's trust ratio needs each parameter whole; expected stage 0 with LAMB, "
           "found stage ",
           config_.stage);
  TS_CHECK(config_.stage == 0 || onebit_config(optimizer) == nullptr,
           "[zero] the 1-bit optimizers are not compatible with ZeRO (as in DeepSpeed); expected "
           "stage 0, found stage ",
           config_.stage);
  check_mixed_precision(precision_, config_.stage);
  const DType dtype = precision_.dtype;
  const Averaging averaging{precision_.communication_dtype(), config_.prescale_gradients,
                            config_.gradient_predivide_factor, mean_over_};
  TS_CHECK(averaging.predivide_factor > 0 && std::isfinite(averaging.predivide_factor),
           "[zero] expected a gradient_predivide_factor > 0, found ", averaging.predivide_factor);
  const DType accumulation = precision_.accumulation_dtype(config_.stage);
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
      TS_CHECK(t.materialized() || (config_.stage == 3 && init != nullptr), "[zero] parameter \"",
               p.name,
               "\" has no values (built under a DeferredInitGuard); expected ZeRO stage 3 with the "
               "model's init_parameter, found stage ",
               config_.stage);
      infos.push_back({p.name, t.shape(), static_cast<int>(g)});
      params_.push_back(t);
    }
  }
  // Stage 3 gives every parameter a block of its own (Note [ZeRO-3 parameters]).
  layout_ = make_flat_layout(infos, dp_.size(), config_.stage == 3 ? 1 : config_.block_numel());
  make_swapper();

  // The parts, chosen once (Note [ZeRO stages]): where the parameters live ...
  if (config_.stage == 3) {
    // 16-bit parameters' masters go to the swap file as they are made.
    ShardOffload offload;
    // f32 parameters are their own masters: swapped only with offload_param.
    const bool f32_shard_swapped = config_.offload_param.device == OffloadParamConfig::Device::nvme;
    offload.masters = is_half(dtype) || f32_shard_swapped ? swapper_.get() : nullptr;
    offload.chunks = param_swapper_.get();
    offload.host_masters = host_steps_;
    offload.host_chunks = host_chunks_;
    offload.pin_chunks = config_.offload_param.device == OffloadParamConfig::Device::cpu &&
                         config_.offload_param.pin_memory;
    auto partitioned =
        std::make_unique<PartitionedWeights>(dp_, layout_, params_, model_, config_, init, offload);
    partitioned_ = partitioned.get();
    weights_ = std::move(partitioned);
  } else {
    auto master = std::make_unique<MasterWeights>(
        dp_, layout_, params_, dtype, device_, config_.stage >= 1, precision_.scaler, host_steps_);
    master_ = master.get();
    scaler_ = master->scaler();
    weights_ = std::move(master);
  }
  if (pinned_) pin_host_masters();
  // ... and the gradients, with the optimizer over what this rank steps.
  if (config_.stage == 0) {
    auto flat = std::make_unique<AllReduceGradients>(dp_, layout_, params_, dtype, accumulation,
                                                     averaging, device_);
    // Every parameter whole: the masters under the parameters' names, with the flat
    // buffer's f32 gradients (the parameters themselves at f32).
    std::vector<optim::ParamGroup> master_groups = groups_;
    if (dtype != DType::f32) {
      int64_t i = 0;
      for (optim::ParamGroup& g : master_groups) {
        for (NamedParameter& p : g.params) {
          p.tensor = master_->masters()[i];
          p.tensor.set_grad(flat->param_grad(i++));
        }
      }
    }
    inner_ = make_inner(optimizer, std::move(master_groups));
    gradients_ = std::move(flat);
  } else {
    if (config_.stage == 1) {
      gradients_ = std::make_unique<ReduceScatterGradients>(
          dp_, layout_, params_, dtype, accumulation, averaging, device_, config_.reduce_scatter);
    } else {
      // On a GPU the gradients stay on the device (Note [Offload on a GPU]).
      gradients_ = std::make_unique<BucketedGradients>(
          dp_, layout_, params_, averaging, device_, config_.reduce_scatter,
          config_.stage == 3 ? config_.reduce_bucket_size : 0,
          host_steps_ ? nullptr : swapper_.get());
    }
    // One optimizer parameter per owned chunk, in its block's group.
    std::vector<optim::ParamGroup> chunks;
    for (const optim::ParamGroup& g : groups_) chunks.push_back({{}, g.lr, g.weight_decay});
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      const int64_t block = static_cast<int64_t>(b);
      Tensor chunk = weights_->own_chunk(block);
      if (host_steps_) {
        // Memory only while the step copies the device's gradient in.
        host_grads_.push_back(
            unmaterialized({layout_.blocks[b].chunk}, {DType::f32, Device::cpu()}));
        chunk.set_grad(host_grads_.back());
      } else {
        chunk.set_grad(gradients_->own_chunk(block));
      }
      chunks[layout_.blocks[b].group].params.push_back({chunk_name(block), chunk, {}});
    }
    inner_ = optim::make_optimizer(optimizer, std::move(chunks));
    start_offload();
  }
  if (config_.overlap_comm && dp_.size() > 1) {
    async_ = std::make_unique<AsyncCollectives>(dp_);
    gradients_->set_async(async_.get(), config_.reduce_bucket_size);
    if (partitioned_ != nullptr) partitioned_->set_async(async_.get());
    if (config_.stage >= 1 && config_.stage <= 2)
      master_->gather_in_background(async_.get(), model_);
  }
  pending_.assign(layout_.blocks.size(), 0);
  reduced_.assign(layout_.blocks.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    register_post_accumulate_hook(params_[i],
                                  [this, i](Tensor&) { on_grad_ready(static_cast<int64_t>(i)); });
  }
  if (experts.group != nullptr) make_expert_part(experts, optimizer, init);
  if (one_pass_step()) model_copies_ = model_copies();  // views of a buffer made once
  zero_grad();
}

void ZeroOptimizer::make_swapper() {
  const OffloadOptimizerConfig::Device optimizer = config_.offload_optimizer.device;
  const OffloadParamConfig::Device params = config_.offload_param.device;
  const bool optimizer_offloaded = optimizer != OffloadOptimizerConfig::Device::none;
  if (!device_.is_cpu()) {
    host_chunks_ = params != OffloadParamConfig::Device::none;
    TS_CHECK(!optimizer_offloaded || (config_.stage >= 1 && is_half(precision_.dtype)),
             "[zero] offload_optimizer on ", device_.str(),
             ": expected ZeRO stage 1-3 with bf16 or fp16 parameters (Note [Offload on a GPU]; "
             "f32 parameters are not implemented yet), found stage ",
             config_.stage, " with ", dtype_name(precision_.dtype), " parameters");
    host_steps_ = optimizer_offloaded;
    pinned_ =
        optimizer == OffloadOptimizerConfig::Device::cpu && config_.offload_optimizer.pin_memory;
  } else {
    // "cpu" takes the GPU's path where it has one, its copies within one memory.
    host_steps_ = optimizer == OffloadOptimizerConfig::Device::cpu && config_.stage >= 1 &&
                  is_half(precision_.dtype);
  }
  // On the CPU, "cpu" is where the states are already.
  if (optimizer == OffloadOptimizerConfig::Device::nvme && config_.stage >= 1) {
    swapper_ = make_offload_swapper(config_, dp_, this);
  }
  if (params == OffloadParamConfig::Device::nvme && config_.stage == 3) {
    // f32 parameters' shard is the optimizer's master: its swap file holds it (Note
    // [Offloaded parameters] in partitioned_params.h).
    TS_CHECK(is_half(precision_.dtype) || optimizer == OffloadOptimizerConfig::Device::nvme,
             "[zero] offload_param \"nvme\" with f32 parameters: their shard is the optimizer's "
             "f32 master, which moves with offload_optimizer; expected offload_optimizer "
             "\"nvme\" too, found \"",
             optimizer == OffloadOptimizerConfig::Device::cpu ? "cpu" : "none", "\"");
    if (is_half(precision_.dtype)) param_swapper_ = make_param_swapper(config_, dp_, this);
  }
}

void ZeroOptimizer::start_offload() {
  if (swapper_ == nullptr) return;
  // Per block, the swapper ids of the sharded f32 masters of 16-bit parameters and of the
  // gradient chunks, where they are swapped (Note [ZeRO's offloaded state]).
  std::vector<int64_t> masters;
  if (master_ != nullptr && master_->sharded_parameters()) {
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      masters.push_back(swapper_->add(master_->own_chunk(static_cast<int64_t>(b)).storage()));
    }
    master_->round_chunks_in_step();
  }
  if (partitioned_ != nullptr) masters = partitioned_->swap_ids();
  offload_ = std::make_unique<ZeroOffload>(config_, layout_, *inner_, *swapper_, masters,
                                           gradients_->swap_ids());
  // The blocks swapped out so far came from the CPU allocator, which keeps them cached.
  allocator_for(Device::cpu()).release_cached();
}

std::unique_ptr<optim::Optimizer> ZeroOptimizer::make_inner(const optim::OptimizerConfig& config,
                                                            std::vector<optim::ParamGroup> groups) {
  if (onebit_config(config) == nullptr) return optim::make_optimizer(config, std::move(groups));
  std::unique_ptr<OneBitOptimizer> onebit = make_onebit_optimizer(config, std::move(groups), dp_);
  onebit_ = onebit.get();
  return onebit;
}

ZeroOptimizer::~ZeroOptimizer() {
  // The hooks capture `this`: make them inert, as the parameters may outlive us. Stage 3's
  // parameters stay as they are: partitioned, with their values in our shard (weights_
  // removes its module hooks).
  for (Tensor& p : params_) {
    if (AutogradMeta* m = p.autograd_meta()) m->post_accumulate_hooks.clear();
  }
}

void ZeroOptimizer::zero_grad() {
  overflow_ = false;
  pending_factor_ = Tensor();
  gradients_->zero_grad();
  if (experts_) experts_->zero_grad();
}

void ZeroOptimizer::set_model_parallel_norm(Communicator& group, std::set<std::string> duplicates) {
  TS_CHECK(experts_ == nullptr,
           "[zero] model parallelism with expert parameters: not supported by Tessera yet; "
           "expected no pipeline and no tensor slicing with ep_size > 1");
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
  TS_INTERNAL_ASSERT(pending_[block] > 0, "[zero] a gradient of block ", block,
                     " completed after the block was reduced");
  if (--pending_[block] == 0) reduce_block(block);
  weights_->grad_ready(param);
}

void ZeroOptimizer::reduce_block(int64_t block) {
  reduced_[block] = true;
  gradients_->reduce_block(block, full_precision_reduction());
}

void ZeroOptimizer::settle_communication() const {
  // Each part waits for all of its own; the first error is rethrown after all have.
  std::exception_ptr first;
  const auto attempt = [&first](const std::function<void()>& wait) {
    try {
      wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  };
  attempt([this] { weights_->settle(); });  // the step's gathers, queued before any reduction
  attempt([this] { gradients_->finish_reductions(); });
  if (async_) attempt([this] { async_->wait_all(); });
  if (experts_) attempt([this] { experts_->settle_communication(); });
  if (first) std::rethrow_exception(first);
}

Tensor ZeroOptimizer::clip_factor(double max_norm) {
  NoGradGuard no_grad;
  settle_communication();
  // This rank's share; gradients that are not sharded are the same on every rank of dp.
  // On the parameters' device: an NCCL group moves device tensors only.
  const Tensor sq = experts_ ? squared_norm_with_experts() : gradients_->squared_norm(counted_);
  if (gradients_->sharded() && !experts_) dp_.all_reduce(sq);
  if (norm_group_ != nullptr) norm_group_->all_reduce(sq);
  // The gradients carry the loss scale (1 without f16): unscale and clip in one multiply.
  return kernels::clip_factor(sq, scaler_ ? scaler_->scale() : 1.0, max_norm,
                              /*overflow_skips=*/scaler_ != nullptr);
}

double ZeroOptimizer::read_clip(const Tensor& factor) {
  const Tensor host = factor.to(Device::cpu());
  const double value = host.data_ptr<double>()[0];
  grad_norm_ = host.data_ptr<double>()[1];
  overflow_ = scaler_ != nullptr && !std::isfinite(grad_norm_);
  if (scaler_ && !full_precision_reduction()) {
    // Local gradients: every rank must agree on skipping the step, or the ones that step
    // would wait in the 1-bit all-reduce for the ones that do not.
    const Tensor any = scalar_tensor(overflow_ ? 1.0 : 0.0, {DType::f32, device_});
    dp_.all_reduce(any, ReduceOp::max);
    overflow_ = any.item<float>() > 0.0f;
  }
  return value;
}

double ZeroOptimizer::clip_grad_norm(double max_norm) {
  pending_factor_ = Tensor();
  const double factor = read_clip(clip_factor(max_norm));
  if (!overflow_ && factor != 1.0) {
    gradients_->scale(factor);
    if (experts_) experts_->gradients_->scale(factor);
  }
  return grad_norm_;
}

void ZeroOptimizer::prepare_step(double max_norm) {
  if (one_pass_step()) {
    overflow_ = false;  // the device finds it, step() reads it
    pending_factor_ = clip_factor(max_norm);
  } else {
    clip_grad_norm(max_norm);
  }
}

bool ZeroOptimizer::step() {
  settle_communication();
  NoGradGuard no_grad;
  if (one_pass_step()) return step_in_one_pass();
  if (scaler_) {
    scaler_->update(overflow_);
    if (overflow_) return false;  // DeepSpeed skips the step and keeps the parameters
  }
  apply_step();
  if (experts_) experts_->apply_step();
  return true;
}

void ZeroOptimizer::apply_step() {
  if (offload_) {
    // Backward's buffers, cached by the CPU allocator, would hold the room the sub-groups
    // need: they go back to the system, and the next backward maps them afresh.
    allocator_for(Device::cpu()).release_cached();
    const bool round = weights_->rounds_in_step();
    offload_->step([&](int64_t block) { prepare_gradient(block); },
                   [&](int64_t block) {
                     if (round) weights_->round_chunk(block, Tensor());
                     release_host_gradient(block);
                   });
    // The step discarded swapped gradients: they read as zeros now, and their norm and
    // scale go with them, as zero_grad() leaves them.
    if (!gradients_->swap_ids().empty()) gradients_->zero_grad();
  } else if (host_steps_) {
    host_step();
  } else {
    inner_->step();
  }
  weights_->after_step();
}

void ZeroOptimizer::make_masters_resident() const {
  if (offload_) offload_->make_masters_resident();
}

bool ZeroOptimizer::full_precision_reduction() const {
  return onebit_ == nullptr || onebit_->reduce_gradients_next();
}

void ZeroOptimizer::set_lr(double lr) {
  inner_->set_lr(lr);
  if (experts_) experts_->set_lr(lr);
}
double ZeroOptimizer::lr() const { return inner_->lr(); }
bool ZeroOptimizer::set_momentum(double beta1) {
  if (experts_) experts_->set_momentum(beta1);
  return inner_->set_momentum(beta1);
}
int64_t ZeroOptimizer::step_count() const { return inner_->step_count(); }

const PartitionedParams* ZeroOptimizer::partitioned() const {
  return partitioned_ ? &partitioned_->partitioned() : nullptr;
}

ModelStateBytes ZeroOptimizer::model_state_bytes() const {
  ModelStateBytes m;
  m.params = weights_->bytes();
  m.grads = gradients_->bytes();
  for (const auto& [key, t] : inner_->state_dict()) {  // in memory: offloaded state is not
    if (key != "step") m.optimizer += static_cast<int64_t>(t.storage().nbytes());
  }
  if (offload_) m.on_nvme = offload_->swapped_bytes();
  if (partitioned_) m.on_nvme += partitioned_->partitioned().swapped_bytes();
  if (host_steps_) {  // the masters and the state are host memory (Note [Offload on a GPU])
    // A chunk's own bytes where they are in memory (it may view a shard of one storage).
    const auto in_memory = [](const Tensor& t) {
      return t.storage().nbytes() > 0 ? static_cast<int64_t>(t.nbytes()) : int64_t{0};
    };
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      const int64_t master = in_memory(weights_->own_chunk(static_cast<int64_t>(b)));
      m.params -= master;
      m.on_host += master + in_memory(host_grads_[b]);
    }
    m.on_host += std::exchange(m.optimizer, 0);
  }
  if (host_chunks_) {  // the 16-bit shard's chunks in host memory
    const int64_t chunks = partitioned_->partitioned().host_chunk_bytes();
    m.params -= chunks;
    m.on_host += chunks;
  }
  if (experts_) {
    const ModelStateBytes e = experts_->model_state_bytes();
    m.params += e.params;
    m.grads += e.grads;
    m.optimizer += e.optimizer;
  }
  return m;
}

}  // namespace tessera::parallel
