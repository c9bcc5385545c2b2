// ZeroOptimizer's expert part (Note [Expert parameters] in zero_optimizer.h).
#include "core/error.h"
#include "core/factories.h"
#include "kernels/elementwise.h"
#include "parallel/compression/onebit_config.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::parallel {

void ZeroOptimizer::make_expert_part(const ExpertParameters& experts,
                                     const optim::OptimizerConfig& optimizer,
                                     const ParameterInit& init) {
  Communicator& group = *experts.group;
  TS_CHECK(experts.modules != nullptr,
           "[zero] expert parameters: expected the module tree that holds them, found none");
  TS_CHECK(group.size() <= dp_.size() && dp_.size() % group.size() == 0,
           "[zero] expert parameters: expected an expert-data group whose size divides the data "
           "group's ",
           dp_.size(), " ranks, found ", group.size(), " ranks");
  TS_CHECK(onebit_config(optimizer) == nullptr,
           "[zero] expert parallelism with a 1-bit optimizer: its compressed all-reduce runs over "
           "the whole data group, where the experts differ between ranks; expected Adam, AdamW, "
           "LAMB or SGD");
  TS_CHECK(config_.offload_optimizer.device == OffloadOptimizerConfig::Device::none &&
               config_.offload_param.device == OffloadParamConfig::Device::none,
           "[zero] expert parallelism with offload_optimizer or offload_param: not supported by "
           "Tessera yet (the two parts would share one swap directory); expected no offload");
  TS_CHECK(!experts.params.empty(),
           "[zero] expert parameters: expected at least one parameter group, found none");
  experts_.reset(new ZeroOptimizer(group, *experts.modules, experts.params, optimizer, config_,
                                   precision_, init, {}, dp_.size()));
}

Tensor ZeroOptimizer::squared_norm_with_experts() {
  // Each element once: a sharded part's shards add up over its group, whose ranks are
  // spread over the data group; an unsharded part's values are the same on every rank of its
  // group, so only the group's rank 0 adds them.
  const auto share = [](ZeroOptimizer& part) {
    const Tensor sq = part.gradients_->squared_norm({});
    return part.gradients_->sharded() || part.dp_.rank() == 0
               ? sq
               : zeros({}, {DType::f64, sq.device()});
  };
  // On the parameters' device: an NCCL group moves device tensors only.
  const Tensor total = kernels::binary(kernels::BinaryOp::add, share(*this), share(*experts_));
  dp_.all_reduce(total);
  return total;
}

}  // namespace tessera::parallel
