#include "autograd/record.h"

#include "autograd/forward_observer.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

bool wants_grad(const Tensor& t) { return t.defined() && t.requires_grad(); }

void attach(const std::shared_ptr<Node>& node, Tensor& out, uint32_t output_nr) {
  if (out.autograd_meta() != nullptr) out = out.detach();
  node->add_output(out);
  AutogradMeta& meta = out.ensure_autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = node;
  meta.output_nr = output_nr;
}

void connect(const std::shared_ptr<Node>& node, const TensorList& inputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(gradient_edge(t));
  node->set_next_edges(std::move(edges));
}

}  // namespace

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (wants_grad(*t)) return true;
  }
  return false;
}

bool needs_grad(const TensorList& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (wants_grad(t)) return true;
  }
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!wants_grad(t)) return {};
  AutogradMeta& meta = t.ensure_autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

void record(const std::shared_ptr<Node>& node, const TensorList& inputs,
            std::initializer_list<Tensor*> outputs) {
  connect(node, inputs);
  uint32_t i = 0;
  for (Tensor* out : outputs) attach(node, *out, i++);
  if (ForwardObserver* o = forward_observer()) o->op(*node, inputs);
}

void record(const std::shared_ptr<Node>& node, const TensorList& inputs,
            std::vector<Tensor>& outputs) {
  connect(node, inputs);
  for (uint32_t i = 0; i < outputs.size(); ++i) attach(node, outputs[i], i);
  if (ForwardObserver* o = forward_observer()) o->op(*node, inputs);
}

void record_function(const std::string& name, const TensorList& inputs,
                     std::initializer_list<Tensor*> outputs, FunctionNode::Backward backward) {
  if (!needs_grad(inputs)) return;
  record(std::make_shared<FunctionNode>(name, std::move(backward)), inputs, outputs);
}

void record_function(const std::string& name, const TensorList& inputs,
                     std::initializer_list<Tensor*> outputs,
                     FunctionNode::BackwardInto backward_into) {
  if (!needs_grad(inputs)) return;
  record(std::make_shared<FunctionNode>(name, std::move(backward_into)), inputs, outputs);
}

void register_post_accumulate_hook(Tensor& leaf, std::function<void(Tensor&)> fn) {
  TS_CHECK(leaf.is_leaf() && leaf.requires_grad(),
           "[register_post_accumulate_hook] expected a leaf that requires grad, found ", leaf.str(),
           leaf.is_leaf() ? " that does not require grad" : " produced by an op");
  leaf.ensure_autograd_meta().post_accumulate_hooks.push_back(std::move(fn));
}

}  // namespace tessera
