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

// Where the gradients flowing to one input of a node sum during backward (Notes
// [Gradients added in place] and [Gradients accumulated into leaves] below).
class GradSlot {
 public:
  // Makes the slot sum into a leaf's existing gradient (contiguous, the leaf's shape):
  // before any gradient arrives.
  void sum_into_leaf(Tensor leaf_grad);
  // Adds g: the first one taken as it is (into a leaf's buffer: added), later ones in place
  // where summable_in_place(), else sum = sum + g.
  void add(const Tensor& g);
  // For a node that adds its gradient in place itself: the tensor to add into, where a
  // gradient of `shape`, dtype and device may be summed into this slot in place (a sum
  // that nothing else holds, or a leaf's buffer), else null. A non-null result counts as a
  // gradient received: the caller must add into it.
  Tensor* in_place(const Shape& shape, DType dtype, Device device);
  // The sum, moved out; undefined where nothing arrived.
  Tensor take();

 private:
  bool summable_in_place(const Shape& shape, DType dtype, Device device) const;

  Tensor sum_;  // undefined until a gradient arrives; a leaf's buffer from the start when
                // into_leaf_
  bool into_leaf_ = false;
  bool received_ = false;  // whether any gradient arrived
};

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
  // computed (Note [Gradients accumulated into leaves]): defined, contiguous, the leaf's
  // shape, dtype and device; else undefined.
  Tensor gradient_to_sum_into() const;

 private:
  Tensor leaf_;
};

// Note [Gradients added in place]
// Gradients flowing to the same place sum in a slot (GradSlot). The slot takes the first
// one as it is and adds later ones in place when it holds the only handle to their memory
// (nothing else can see the change): the tied LM head's and the embedding's (Vp, C)
// gradients of wte then sum in one buffer. A node with a BackwardInto goes further and
// adds its gradient straight into the slot: the embedding adds B x T rows into wte's
// (Vp, C) gradient instead of writing a dense (Vp, C) tensor that is then added (GPT-2
// 124M: 154 MB zeroed, scattered into and summed, about 20 ms of a 1.1 s CPU step).
//
// Note [Gradients accumulated into leaves]
// Where a leaf already holds a gradient that later ones are added to (ZeRO's flat gradient
// buffers, zeroed each step; a leaf's .grad from an earlier micro-batch), the engine makes
// that buffer the sum of the slot its AccumulateGrad reads (GradSlot::sum_into_leaf), so
// each gradient is added into it as it is computed and AccumulateGrad only runs the hooks.
// A linear layer's weight gradient is then one GEMM with beta = 1 into the buffer
// (kernels::add_linear_param_grads; Megatron-LM's gradient_accumulation_fusion does the
// same into its main_grad, megatron/core/tensor_parallel/layers.py), not a GEMM into a new tensor
// and an add over both, and the embedding's rows go straight in. Contributions are added
// into the buffer one by one where they used to be summed first and added once: the same
// values up to rounding, and the same bits where the buffer held zeros and one gradient
// arrives (a parameter used once, in the first micro-batch).

}  // namespace tessera
