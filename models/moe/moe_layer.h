// A mixture-of-experts layer: DeepSpeed's deepspeed.moe.layer.MoE (DeepSpeed-MoE,
// arXiv:2201.05596; GShard, arXiv:2006.16668) on one rank.
//
// Note [MoE dispatch and combine]
// The gate (Note [MoE routing] in gating.h) gives each token up to k slots in the experts'
// capacity buffers (E x C rows). Dispatch fills the buffers by gathering token rows
// (index_select over the tokens plus one zero row, which empty slots read), each expert
// runs on its C rows, and combine gathers each token's rows back from the experts' outputs
// (plus one zero row, which dropped choices read) and sums them weighted by the gate. Both
// are gathers by index, differentiated as scatters (index_select's backward), instead of
// DeepSpeed's one-hot einsums over tokens x experts x capacity. The gate and its weights
// are f32 whatever the model's dtype (DeepSpeed's TopKGate); the combine weights are cast
// to it. With use_residual (Residual MoE, PR-MoE) the output is
// moe(x) * c0 + mlp(x) * c1 with c = softmax(coefficient(x)).
// The layer returns l_aux; the model adds coefficient * l_aux to its loss, as DeepSpeed's
// users do.
//
// Note [Expert parallelism]
// Over an expert-parallel group of P ranks (DeepSpeed's ep_size) each rank holds E / P
// experts, the global experts [rank * E / P, (rank + 1) * E / P), registered under their
// global index. Every rank gates its own tokens into all E experts' buffers (E x C rows);
// an all-to-all sends each rank the buffers of its experts from every rank (P x E / P x C
// rows), each local expert runs on its P x C rows, and a second all-to-all returns the
// outputs to the ranks whose tokens they are, where combine proceeds as on one rank. The
// all-to-alls are autograd ops (parallel/expert/all_to_all.h): backward sends the
// gradients the other way. Every rank must use the same capacity: without drop_tokens the
// group takes its largest (an all-reduce, as DeepSpeed's); with it, every rank must route
// equally many tokens (checked).
#pragma once

#include <functional>
#include <memory>

#include "autograd/module.h"
#include "core/philox.h"
#include "models/layers/linear.h"
#include "models/moe/gating.h"
#include "parallel/comm/communicator.h"

namespace tessera::moe {

// The gate's linear map, C -> E without bias, computed in f32 whatever dtype a
// mixed-precision run gives its weight (DeepSpeed's TopKGate casts its wg back to f32).
class GateLinear : public Layer {
 public:
  // Parameter "weight" (E, C), zero-initialized like Linear.
  GateLinear(int64_t n_embd, int64_t num_experts);

 protected:
  Tensor forward(const Tensor& x) const override;  // (S, C) -> (S, E) f32

 private:
  Tensor weight_;
};

// What one call of the layer gives.
struct MoeOutput {
  Tensor output;    // (..., C), as the input
  Tensor l_aux;     // scalar f32: the load-balancing loss, differentiable through the gate
  Routing routing;  // the gate's decisions: capacity, per-expert counts, dropped choices
};

class MoeLayer : public Module {
 public:
  // `num_experts` experts made by make_expert(e), registered as "experts.<e>" (with an
  // expert-parallel group, this rank's share: Note [Expert parallelism]); the gate "gate"
  // (an f32 Linear, C -> num_experts, no bias); with use_residual a dense expert "mlp" =
  // make_expert(-1) and "coefficient" (Linear C -> 2 with bias, in `dtype`). Jitter,
  // Gumbel noise and random priorities draw from `gen`. The group must outlive the layer
  // and its size divide num_experts.
  MoeLayer(int64_t n_embd, int64_t num_experts, const GateConfig& gate, bool use_residual,
           const std::function<std::unique_ptr<Layer>(int64_t expert)>& make_expert, Generator& gen,
           DType dtype = DType::f32, parallel::Communicator* expert_group = nullptr);

  MoeOutput forward(const Tensor& x) const;  // (..., C) -> (..., C)

  // All experts of the layer, this rank's or not.
  int64_t num_experts() const { return num_experts_; }
  // The experts this rank holds: [first_local_expert(), + local_experts()).
  int64_t local_experts() const { return num_experts_ / ep_size_; }
  int64_t first_local_expert() const { return ep_rank_ * local_experts(); }
  // This rank's experts: "<e>" for e in [first_local_expert(), + local_experts()).
  Module& experts() { return experts_; }
  // The gating arguments the layer was built with.
  const GateConfig& gate_config() const { return config_; }

 private:
  // The gate's random draws for `tokens` tokens (Note [MoE routing]).
  RoutingNoise draw_noise(int64_t tokens) const;
  // Expert parallelism: makes `routing`'s capacity the group's (Note [Expert parallelism]),
  // through an all-reduce of tensors on `device`; throws on every rank alike when ranks
  // that drop tokens disagree.
  void agree_on_capacity(Routing& routing, Device device) const;
  // The experts' outputs for the dispatched buffers (E * C, C): this rank's experts alone,
  // or the group's through two all-to-alls (Note [Expert parallelism]).
  Tensor run_experts(const Tensor& buffers, int64_t capacity) const;

  int64_t n_embd_, num_experts_;
  parallel::Communicator* expert_group_;  // null: every expert here
  int ep_size_, ep_rank_;
  GateConfig config_;
  Generator& gen_;
  GateLinear gate_;
  ModuleList experts_;
  std::unique_ptr<Layer> residual_mlp_;
  std::unique_ptr<Linear> coefficient_;
};

}  // namespace tessera::moe
