#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/backward_observer.h"
#include "autograd/record.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

// Gradients waiting at one node's outputs, summed as they arrive.
struct InputBuffer {
  std::vector<GradSlot> slots;
  int dependencies = 0;
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

}  // namespace

void backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph) {
  TS_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "[backward] expected ",
           roots.size(), " root gradients, found ", grad_roots.size());
  NoGradGuard no_grad;  // gradients are computed, not differentiated again

  std::unordered_map<Node*, InputBuffer> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  // Count, for every reachable node, how many edges lead into it.
  std::vector<Node*> stack;
  auto visit = [&](const std::shared_ptr<Node>& n) {
    auto [it, inserted] = owners.emplace(n.get(), n);
    if (inserted) stack.push_back(n.get());
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    TS_CHECK(root.defined() && root.requires_grad(), "[backward] root ", i,
             " does not require grad: expected a tensor computed from parameters that require "
             "grad, found ",
             root.str());
  }
  for (const Tensor& root : roots) {
    Edge e = gradient_edge(root);
    visit(e.node);
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    InputBuffer& buffer = buffers[n];
    buffer.slots.resize(n->outputs().empty() ? 1 : n->outputs().size());
    // Note [Gradients accumulated into leaves] in autograd/grad_slot.h.
    if (auto* leaf = dynamic_cast<AccumulateGrad*>(n)) {
      if (Tensor grad = leaf->start_summing_into_gradient(); grad.defined()) {
        buffer.slots[0].sum_into_leaf(std::move(grad));
      }
    }
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++buffers[e.node.get()].dependencies;
      visit(e.node);
    }
  }

  // Seed the roots.
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    Tensor seed = grad_roots.empty() ? Tensor() : grad_roots[i];
    if (!seed.defined()) {
      TS_CHECK(root.numel() == 1, "[backward] an implicit gradient needs a one-element root, ",
               "found shape ", shape_str(root.shape()), ": pass the root's gradient explicitly");
      seed = ones(root.shape(), {root.dtype(), root.device()});
    }
    TS_CHECK(seed.shape() == root.shape() && seed.dtype() == root.dtype(),
             "[backward] root gradient ", seed.str(), " does not match root ", root.str());
    Edge e = gradient_edge(root);
    buffers[e.node.get()].slots[e.input_nr].add(seed.detach());
  }

  // Deferred nodes run when nothing else is ready (Note [Deferred gradient waits] in
  // autograd/gradient_wait.h).
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready, deferred;
  const auto make_ready = [&](Node* node) { (node->deferred() ? deferred : ready).push(node); };
  for (auto& [node, buf] : buffers) {
    if (buf.dependencies == 0) make_ready(node);
  }
  while (!ready.empty() || !deferred.empty()) {
    auto& queue = ready.empty() ? deferred : ready;
    Node* node = queue.top();
    queue.pop();
    TensorList grads;
    for (GradSlot& slot : buffers[node].slots) grads.push_back(slot.take());
    // Outputs that received no gradient contribute zeros.
    for (size_t i = 0; i < grads.size() && i < node->outputs().size(); ++i) {
      if (!grads[i].defined()) {
        const OutputInfo& o = node->outputs()[i];
        grads[i] = zeros(o.shape, {o.dtype, o.device});
      }
    }
    // Each input's gradient sums in the buffer of the node it flows to.
    const std::vector<Edge>& edges = node->next_edges();
    std::vector<GradSlot*> slots(edges.size(), nullptr);
    for (size_t i = 0; i < edges.size(); ++i) {
      if (edges[i].valid()) slots[i] = &buffers[edges[i].node.get()].slots[edges[i].input_nr];
    }
    if (BackwardObserver* observer = backward_observer()) {  // Note [Backward observers]
      observer->begin(*node);
      struct End {
        BackwardObserver& observer;
        const Node& node;
        ~End() { observer.end(node); }
      } end{*observer, *node};
      node->apply_into(grads, slots);
    } else {
      node->apply_into(grads, slots);
    }
    grads.clear();
    if (!retain_graph) node->release_saved();
    for (const Edge& e : edges) {
      if (e.valid() && --buffers[e.node.get()].dependencies == 0) make_ready(e.node.get());
    }
  }
}

void backward(const Tensor& root, const Tensor& grad_root, bool retain_graph) {
  backward(TensorList{root}, TensorList{grad_root}, retain_graph);
}

}  // namespace tessera
