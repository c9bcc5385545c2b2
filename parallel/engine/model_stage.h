// A TrainableModel built as one pipeline stage, as the pipeline executor runs it, and the
// tied parameters' reduction over the stages that hold copies of them (DeepSpeed's
// ReduceTiedGrads, deepspeed/runtime/pipe/engine.py).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "parallel/comm/communicator.h"
#include "parallel/engine/trainable_model.h"
#include "parallel/pipeline/executor.h"
#include "parallel/topology.h"

namespace tessera::parallel {

class ModelStage : public pipeline::PipelineStage {
 public:
  // backward(root, grad, last, extra, loss_seed): how gradients flow from `root` seeded with
  // `grad`, and from the scalar `extra` (when defined) seeded with `loss_seed`; autograd's
  // backward by default (an optimizer that reduces from gradient hooks passes its own).
  // `model` must outlive this.
  using Backward = std::function<void(const Tensor& root, const Tensor& grad, bool last,
                                      const Tensor& extra, const Tensor& loss_seed)>;
  explicit ModelStage(TrainableModel& model, Backward backward = {});

  Tensor forward(const Tensor& input) override;  // TrainableModel::forward_stage
  Tensor loss(const Tensor& output, const Tensor& labels) override;
  void backward(const Tensor& root, const Tensor& grad, bool last) override;
  Tensor extra_loss() override;  // TrainableModel::stage_extra_loss
  void backward_with(const Tensor& root, const Tensor& grad, bool last, const Tensor& extra,
                     const Tensor& loss_seed) override;
  Device device() const override { return device_; }

 private:
  TrainableModel& model_;
  Backward backward_;
  Device device_;
};

// The group of the stages whose model lists tied parameters (null on the other stages, and
// when fewer than two stages hold any). Collective over `pipe`.
std::unique_ptr<Communicator> tied_stage_group(const TrainableModel& model, Communicator& pipe);

// Sums the gradients of the model's tied parameters over `tied`, so every copy takes the
// same step. Throws when one of them has no gradient.
void reduce_tied_gradients(const TrainableModel& model, Communicator& tied);

// The names of this rank's parameters that another rank of its model replica also holds,
// for the gradient norm to count once: replicated parameters on model-group ranks > 0, and
// the tied copies on every stage of `tied` but its first (`tied` may be null).
std::set<std::string> replica_duplicates(const TrainableModel& model, const ParallelGroups& groups,
                                         const Communicator* tied);

}  // namespace tessera::parallel
