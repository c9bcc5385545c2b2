#include "models/gpt2/pipeline_stage.h"

#include "autograd/engine.h"
#include "core/error.h"

namespace tessera {

GptPipelineStage::GptPipelineStage(Gpt& model, Backward backward)
    : model_(model), backward_(std::move(backward)), device_(Device::cpu()) {
  const std::vector<NamedParameter> params = model.named_parameters();
  if (!params.empty()) device_ = params.front().tensor.device();
}

Tensor GptPipelineStage::forward(const Tensor& input) { return model_.forward_stage(input); }

Tensor GptPipelineStage::loss(const Tensor& output, const Tensor& labels) {
  return model_.loss(output, labels);
}

void GptPipelineStage::backward(const Tensor& root, const Tensor& grad, bool last) {
  if (backward_) return backward_(root, grad, last);
  tessera::backward(root, grad);
}

std::unique_ptr<parallel::Communicator> tied_stage_group(parallel::Communicator& pipe) {
  const bool ends = pipe.rank() == 0 || pipe.rank() == pipe.size() - 1;
  std::unique_ptr<parallel::Communicator> group = pipe.split(ends ? 0 : -1, pipe.rank());
  if (group && group->size() == 1) return nullptr;  // one stage: nothing is tied across
  return group;
}

void reduce_tied_gradients(const Gpt& model, parallel::Communicator& tied) {
  for (const NamedParameter& p : model.named_parameters()) {
    if (p.name != "transformer.wte.weight") continue;
    const Tensor g = p.tensor.grad();
    TS_CHECK(g.defined(), "[gpt2] ReduceTiedGrads: transformer.wte.weight has no gradient; ",
             "expected every stage holding it to have run backward");
    tied.all_reduce(g);
  }
}

}  // namespace tessera
