// The matrix products of one GPT-2 training step, timed alone (tools/bench/gpt2_step_bench).
//
// Note [GEMM share of the step]
// The step's matrix products, timed one by one at the shapes and layouts the autograd ops
// use (linear: y = x W^T, backward dx = g W and dW = g^T x; the tied head: logits = h wte^T,
// dh = g wte, dwte^T = h^T g; attention's own products are left in "everything else").
// Their sum is the step's GEMM time at isolated rates, and the step minus that sum is
// everything else: attention, LayerNorm, GELU, cross-entropy, residual adds, gradient
// accumulation, copies, AdamW, and any slowdown the GEMMs suffer inside the step. The bench
// alternates one step and one pass over the GEMMs, so drift in the machine's speed hits
// both alike.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "models/gpt2/config.h"

namespace tessera::bench {

class StepGemms {
 public:
  static constexpr int kGroups = 5;
  static constexpr const char* kNames[kGroups] = {"forward linears", "forward head",
                                                  "backward linears dX", "backward linears dW",
                                                  "backward head dX, dW"};

  // Operands for a step of `rows` = B x T tokens (random, of `dtype`; several hundred MB
  // for GPT-2).
  StepGemms(const GptConfig& c, int64_t rows, DType dtype = DType::f32);

  // Seconds per group for one step's worth of calls.
  std::array<double, kGroups> run() const;
  // FLOPs and calls per step in `group`.
  double flops(int group) const { return flops_[group]; }
  int64_t calls(int group) const { return calls_[group]; }

 private:
  struct Gemm {
    int group;
    int64_t count;  // calls per step
    Tensor a, b;
    bool ta, tb;
  };
  void add(int group, int64_t count, const Shape& a, const Shape& b, bool ta, bool tb);

  DType dtype_;
  Generator gen_{7};
  std::vector<Gemm> gemms_;
  std::array<double, kGroups> flops_{};
  std::array<int64_t, kGroups> calls_{};
};

}  // namespace tessera::bench
