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
  // Frees saved tensors after a backward without retain_graph.
  virtual void release_saved() = 0;

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
  FunctionNode(std::string name, Backward backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}

  std::string name() const override { return name_; }
  TensorList apply(const TensorList& grad_outputs) override;
  void release_saved() override { backward_ = nullptr; }

 private:
  std::string name_;
  Backward backward_;
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

}  // namespace tessera
