// Nodes of the autograd graph.
//
// Every differentiable op records one Node per call: it holds what the backward needs
// (saved tensors) and edges to the nodes that produced its inputs. Backward walks the
// nodes from the loss towards the leaves (autograd/engine.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_slot.h"
#include "core/tensor.h"

namespace tessera {

// Where the gradient of one input goes: input `input_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// Shape, dtype and device of one output, to build zero gradients when needed.
struct OutputInfo {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

using TensorList = std::vector<Tensor>;

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // The op's name, used in errors: "matmul", "layer_norm", ...
  virtual std::string name() const = 0;
  // Gradients of the inputs (one per next edge; undefined where none flows) from the
  // gradients of the outputs (one per output, all defined).
  virtual TensorList apply(const TensorList& grad_outputs) = 0;
  // Adds the gradients of the inputs into `slots`, one per next edge: where that edge's
  // gradient sums (null for an invalid edge). The default adds apply()'s gradients; a node
  // whose gradient is a few rows of a large input (an embedding's), or a product that can
  // accumulate (a linear layer's weight gradient), adds in place instead (Notes [Gradients
  // added in place] and [Gradients accumulated into leaves]).
  virtual void apply_into(const TensorList& grad_outputs, const std::vector<GradSlot*>& slots);
  // Frees saved tensors after a backward without retain_graph.
  virtual void release_saved() = 0;
  // Whether the engine runs this node only when no other node is ready (Note [Deferred
  // gradient waits] in autograd/gradient_wait.h); false for every op but such waits.
  virtual bool deferred() const { return false; }

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  const std::vector<OutputInfo>& outputs() const { return outputs_; }
  void add_output(const Tensor& t) { outputs_.push_back({t.shape(), t.dtype(), t.device()}); }
  // Creation order on this thread: the engine runs later nodes first.
  uint64_t sequence_nr() const { return sequence_nr_; }

 private:
  std::vector<Edge> next_edges_;
  std::vector<OutputInfo> outputs_;
  uint64_t sequence_nr_;
};

// A node whose backward is a function; the saved tensors are its captures, so releasing
// the graph destroys the function. Ops write their backward as a lambda next to the
// forward (autograd/ops/*.cc).
class FunctionNode final : public Node {
 public:
  using Backward = std::function<TensorList(const TensorList& grad_outputs)>;
  // Adds the input gradients into the slots, as Node::apply_into describes.
  using BackwardInto =
      std::function<void(const TensorList& grad_outputs, const std::vector<GradSlot*>& slots)>;
  FunctionNode(std::string name, Backward backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  FunctionNode(std::string name, BackwardInto backward_into)
      : name_(std::move(name)), backward_into_(std::move(backward_into)) {}

  std::string name() const override { return name_; }
  TensorList apply(const TensorList& grad_outputs) override;
  void apply_into(const TensorList& grad_outputs, const std::vector<GradSlot*>& slots) override;
  void release_saved() override {
    backward_ = nullptr;
    backward_into_ = nullptr;
  }

 private:
  void check_not_freed() const;

  std::string name_;
  Backward backward_;           // set for nodes that return their gradients,
  BackwardInto backward_into_;  // or this, for nodes that add them into the slots
};

// The node that adds incoming gradients into a leaf's .grad and runs its hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  TensorList apply(const TensorList& grad_outputs) override;
  void release_saved() override {}
  // The leaf's gradient where later gradients may be summed into it in place as they are
  // computed (Note [Gradients accumulated into leaves] in autograd/grad_slot.h): defined,
  // contiguous, the leaf's shape, dtype and device; else undefined. Remembered until apply(),
  // which refuses that buffer if the leaf's gradient was replaced meanwhile.
  Tensor start_summing_into_gradient();

 private:
  Tensor leaf_;
  Tensor summed_into_;  // start_summing_into_gradient()'s buffer, until apply()
};

}  // namespace tessera
