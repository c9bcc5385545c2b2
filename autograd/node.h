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
  // gradient sums (undefined until one arrives; null for an invalid edge). The default
  // sums apply()'s gradients with add_grad; a node whose gradient is a few rows of a large
  // input (an embedding's) adds those rows in place instead (Note [Gradients added in
  // place]).
  virtual void apply_into(const TensorList& grad_outputs, const std::vector<Tensor*>& slots);
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
      std::function<void(const TensorList& grad_outputs, const std::vector<Tensor*>& slots)>;
  FunctionNode(std::string name, Backward backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  FunctionNode(std::string name, BackwardInto backward_into)
      : name_(std::move(name)), backward_into_(std::move(backward_into)) {}

  std::string name() const override { return name_; }
  TensorList apply(const TensorList& grad_outputs) override;
  void apply_into(const TensorList& grad_outputs, const std::vector<Tensor*>& slots) override;
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

 private:
  Tensor leaf_;
};

// Note [Gradients added in place]
// Gradients flowing to the same place sum in a slot. add_grad takes the first one as it is
// and adds later ones in place when the slot holds the only handle to its memory (nothing
// else can see the change): the tied LM head's and the embedding's (Vp, C) gradients of
// wte then sum in one buffer. A node with a BackwardInto goes further and adds its
// gradient straight into the slot: the embedding adds B x T rows into wte's (Vp, C)
// gradient instead of writing a dense (Vp, C) tensor that is then added (GPT-2 124M:
// 154 MB zeroed, scattered into and summed, about 20 ms of a 1.1 s CPU step).

// True when a gradient of `shape`, dtype and device may be summed into slot in place (see
// the note): slot is defined, the only handle to its contiguous memory, and matches them.
bool summable_in_place(const Tensor& slot, const Shape& shape, DType dtype, Device device);

// Sums g into a gradient slot (see the note): slot = g when the slot is undefined, in place
// when summable_in_place, slot = slot + g otherwise.
void add_grad(Tensor& slot, const Tensor& g);

}  // namespace tessera
