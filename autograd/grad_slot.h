// GradSlot: where the gradients flowing to one input of a node sum during backward.
#pragma once

#include "core/tensor.h"

namespace tessera {

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

// sum += g in place: an axpy where sum is contiguous and of g's dtype, else sum = sum + g
// written into sum's own memory (so a gradient viewing a larger buffer, ZeRO's flat
// gradients, stays a view of it, and a leaf's dtype is kept).
void add_in_place(const Tensor& sum, const Tensor& g);

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

}  // namespace tessera
