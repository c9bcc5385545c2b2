// The `moe` part of a GPT model section: which blocks' MLPs are mixtures of experts
// (models/moe/moe_layer.h) and how they route.
//
// Note [GPT-MoE]
// As Megatron-DeepSpeed's GPT-MoE (megatron/model/transformer.py with --num-experts and
// --expert-interval): block i (0-based) has an MoE MLP when (i + 1) % moe_every == 0, so
// moe_every 2 makes every other block sparse, starting with the second. num_experts is one
// count for every MoE block, or one per MoE block (PR-MoE's pyramid: more experts in later
// blocks, DeepSpeed-MoE arXiv:2201.05596 section 4.1). Each expert is the dense block's
// feed-forward network (C -> 4C -> C), and the model's training loss adds aux_loss_coef times
// the sum of the MoE blocks' load-balancing losses (Megatron-DeepSpeed's --moe-loss-coeff,
// 0.01); evaluation reports the cross-entropy alone. A pipeline stage without the head hands
// its blocks' term to the executor (stage_extra_loss), which backpropagates it from the
// loss's seed and adds it to the reported loss; activation checkpointing makes each
// segment return its blocks' terms (Gpt::checkpointed_moe_blocks). ep_size splits each MoE
// block's experts over an expert group of that many data-parallel ranks (Note [Expert
// groups] in parallel/expert/expert_groups.h); it places the model rather than defining it,
// so checkpoints reshard to another (GptSpec::without_placement).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "models/moe/gating.h"

namespace tessera {

struct GptMoeConfig {
  std::vector<int64_t> num_experts{8};  // one count, or one per MoE block
  int64_t moe_every = 2;
  moe::GateConfig gate;
  bool use_residual = false;
  double aux_loss_coef = 0.01;
  int64_t ep_size = 1;  // must divide every num_experts

  // Whether block `layer` (0-based) has an MoE MLP.
  bool is_moe_block(int64_t layer) const { return (layer + 1) % moe_every == 0; }
  // How many of n_layer blocks are MoE blocks.
  int64_t moe_blocks(int64_t n_layer) const { return n_layer / moe_every; }
  // The experts of MoE block `layer`.
  int64_t experts_at(int64_t layer) const;
  // Throws one line naming the first inconsistent field; messages start with `where`.
  void validate(int64_t n_layer, const std::string& where) const;

  // Reads {"num_experts": n | [n, ...], "moe_every", "k", "capacity_factor",
  // "eval_capacity_factor", "min_capacity", "noisy_gate_policy", "drop_tokens", "use_rts",
  // "top2_2nd_expert_sampling", "use_residual", "aux_loss_coef", "ep_size"}, DeepSpeed's
  // names and defaults where DeepSpeed has them (the enclosing reader's finish() checks for
  // unknown keys).
  static GptMoeConfig from_json(JsonObjectReader moe);
  nlohmann::json to_json() const;
};

}  // namespace tessera
