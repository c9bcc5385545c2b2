#include "parallel/engine/model_stage.h"

#include <vector>

#include "autograd/engine.h"
#include "core/error.h"

namespace tessera::parallel {

ModelStage::ModelStage(TrainableModel& model, Backward backward)
    : model_(model), backward_(std::move(backward)), device_(Device::cpu()) {
  TS_CHECK(model.capabilities().pipeline,
           "[engine] a pipeline stage: expected a model that can be split into stages, found "
           "one whose capabilities() have no pipeline");
  const std::vector<NamedParameter> params = model.named_parameters();
  if (!params.empty()) device_ = params.front().tensor.device();
}

Tensor ModelStage::forward(const Tensor& input) { return model_.forward_stage(input); }

Tensor ModelStage::loss(const Tensor& output, const Tensor& labels) {
  return model_.loss(output, labels);
}

void ModelStage::backward(const Tensor& root, const Tensor& grad, bool last) {
  backward_with(root, grad, last, Tensor(), Tensor());
}

Tensor ModelStage::extra_loss() { return model_.stage_extra_loss(); }

void ModelStage::backward_with(const Tensor& root, const Tensor& grad, bool last,
                               const Tensor& extra, const Tensor& loss_seed) {
  if (backward_) return backward_(root, grad, last, extra, loss_seed);
  if (!extra.defined()) return tessera::backward(root, grad);
  tessera::backward({root, extra}, {grad, loss_seed.to(extra.dtype())});
}

std::unique_ptr<Communicator> tied_stage_group(const TrainableModel& model, Communicator& pipe) {
  const bool holds = !model.tied_parameter_names().empty();
  std::unique_ptr<Communicator> group = pipe.split(holds ? 0 : -1, pipe.rank());
  if (group && group->size() == 1) return nullptr;  // nothing is tied across stages
  return group;
}

void reduce_tied_gradients(const TrainableModel& model, Communicator& tied) {
  const std::vector<NamedParameter> params = model.named_parameters();
  // In the order of tied_parameter_names(), which every stage of `tied` shares.
  for (const std::string& name : model.tied_parameter_names()) {
    const NamedParameter* p = nullptr;
    for (const NamedParameter& q : params) p = q.name == name ? &q : p;
    TS_CHECK(p != nullptr, "[engine] ReduceTiedGrads: the model lists ", name,
             " as tied; expected a parameter of that name, found none");
    const Tensor g = p->tensor.grad();
    TS_CHECK(g.defined(), "[engine] ReduceTiedGrads: ", name,
             " has no gradient; expected every stage holding it to have run backward");
    tied.all_reduce(g);
  }
}

std::set<std::string> replica_duplicates(const TrainableModel& model, const ParallelGroups& groups,
                                         const Communicator* tied) {
  std::set<std::string> out;
  const bool tied_copy = tied != nullptr && tied->rank() > 0;
  if (tied_copy) {
    for (const std::string& n : model.tied_parameter_names()) out.insert(n);
  }
  if (groups.coord.model > 0) {
    for (const NamedParameter& p : model.named_parameters()) {
      if (p.placement.kind == Placement::Kind::replicated) out.insert(p.name);
    }
  }
  return out;
}

}  // namespace tessera::parallel
