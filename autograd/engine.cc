#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/record.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"

namespace tessera {
namespace {

// Gradients waiting at one node's outputs, summed as they arrive.
struct InputBuffer {
  TensorList grads;
  int dependencies = 0;
};

// Sums g into slot. In place when slot is the only handle to its memory (nothing else can
// see the change): the tied LM head and embedding's (Vp, C) gradients then take one pass
// instead of a new tensor.
void add_to(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
  } else if (slot.is_unique() && slot.is_contiguous() && slot.dtype() == g.dtype() &&
             slot.shape() == g.shape()) {
    kernels::axpy_(slot, g);
  } else {
    slot = kernels::binary(kernels::BinaryOp::add, slot, g);
  }
}

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
    buffers[n].grads.resize(n->outputs().empty() ? 1 : n->outputs().size());
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
    add_to(buffers[e.node.get()].grads[e.input_nr], seed.detach());
  }

  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (auto& [node, buf] : buffers) {
    if (buf.dependencies == 0) ready.push(node);
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    TensorList grads = std::move(buffers[node].grads);
    // Outputs that received no gradient contribute zeros.
    for (size_t i = 0; i < grads.size() && i < node->outputs().size(); ++i) {
      if (!grads[i].defined()) {
        const OutputInfo& o = node->outputs()[i];
        grads[i] = zeros(o.shape, {o.dtype, o.device});
      }
    }
    TensorList input_grads = node->apply(grads);
    grads.clear();
    if (!retain_graph) node->release_saved();
    const std::vector<Edge>& edges = node->next_edges();
    TS_INTERNAL_ASSERT(input_grads.empty() || input_grads.size() == edges.size(), node->name(),
                       " returned ", input_grads.size(), " gradients for ", edges.size(),
                       " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid()) continue;
      InputBuffer& buf = buffers[e.node.get()];
      if (i < input_grads.size() && input_grads[i].defined()) {
        const Tensor& g = input_grads[i];
        const std::vector<OutputInfo>& outs = e.node->outputs();
        if (!outs.empty()) {
          TS_INTERNAL_ASSERT(g.shape() == outs[e.input_nr].shape, node->name(),
                             " produced a gradient of shape ", shape_str(g.shape()), " for ",
                             e.node->name(), " output of shape ",
                             shape_str(outs[e.input_nr].shape));
        }
        add_to(buf.grads[e.input_nr], g);
      }
      if (--buf.dependencies == 0) ready.push(e.node.get());
    }
  }
}

void backward(const Tensor& root, const Tensor& grad_root, bool retain_graph) {
  backward(TensorList{root}, TensorList{grad_root}, retain_graph);
}

}  // namespace tessera
