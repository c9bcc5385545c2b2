// A GPT pipeline stage (Note [Pipeline GPT] in models/gpt2/gpt.h) as the pipeline executor
// runs it, and the reduction of the tied embedding's two copies.
#pragma once

#include <functional>
#include <memory>

#include "models/gpt2/gpt.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/executor.h"

namespace tessera {

class GptPipelineStage : public parallel::pipeline::PipelineStage {
 public:
  // backward(root, grad, last): how gradients flow, autograd's backward by default (an
  // optimizer that reduces from gradient hooks passes its own). `model` must outlive this.
  using Backward = std::function<void(const Tensor& root, const Tensor& grad, bool last)>;
  explicit GptPipelineStage(Gpt& model, Backward backward = {});

  Tensor forward(const Tensor& input) override;  // Gpt::forward_stage
  Tensor loss(const Tensor& output, const Tensor& labels) override;
  void backward(const Tensor& root, const Tensor& grad, bool last) override;
  Device device() const override { return device_; }

 private:
  Gpt& model_;
  Backward backward_;
  Device device_;
};

// The group of the first and the last pipeline stage, which both hold wte when the head is
// tied (null on the other stages, and on a pipeline of one stage). Collective over `pipe`.
std::unique_ptr<parallel::Communicator> tied_stage_group(parallel::Communicator& pipe);

// DeepSpeed's ReduceTiedGrads: sums the gradient of wte over `tied` so both copies take the
// same step. Does nothing when the model holds no wte.
void reduce_tied_gradients(const Gpt& model, parallel::Communicator& tied);

}  // namespace tessera
