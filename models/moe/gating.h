// Top-k gating of a mixture-of-experts layer: which experts each token goes to, where in
// their capacity buffers, and which tokens are dropped.
//
// Note [MoE routing]
// DeepSpeed's TopKGate (deepspeed/moe/sharded_moe.py, top1gating and top2gating; GShard,
// arXiv:2006.16668, Algorithm 1; Switch Transformer, arXiv:2101.03961), everything in f32:
// - probs = softmax(x W_g^T) over E experts, for S tokens.
// - Capacity per expert C = ceil(S / E * capacity_factor * k) (the product in f32, as
//   DeepSpeed's), at least min_capacity
//   (eval_capacity_factor outside training). Without drop_tokens, C is the largest number
//   of tokens any expert received (no token is dropped).
// - Top-1: expert argmax(probs), or argmax(logits + Gumbel noise) with the RSample policy.
//   Tokens beyond C are dropped: with use_rts (random token selection) each expert keeps
//   the C of its tokens with the highest uniform random priority, otherwise the first C in
//   token order. A kept token's slot is its rank, in token order, among the expert's kept
//   tokens. Its combine weight is its (unnormalised) probability.
// - Top-2: first expert argmax(probs); second argmax of the logits (plus Gumbel noise with
//   top2_2nd_expert_sampling) with the first masked out. First choices take the slots
//   0.. in token order, second choices queue after all of the expert's first choices; a
//   choice whose slot is C or beyond is dropped. The combine weights p1 / (p1 + p2) and
//   p2 / (p1 + p2) count only the kept choices (a token with one kept choice weighs it 1;
//   the sum is clamped below at f32's epsilon, so one with none weighs 0).
// - Top-1 in training needs at least min_capacity tokens (DeepSpeed asserts it; evaluation,
//   generation's few tokens a step included, does not).
// - Load-balancing loss l_aux = E * sum_e mean_s(probs[s, e]) * (fraction of tokens whose
//   first choice is e, before dropping), the same for k = 1 and 2.
// - exp_counts: tokens per expert before dropping (first and second choices for k = 2).
// The noise is drawn by the caller (MoeLayer) and handed in, so routing is a function of
// its inputs: tests compare it with a per-token loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::moe {

// DeepSpeed's noisy_gate_policy.
enum class NoisyGatePolicy { none, jitter, rsample };

// Parses "None" (or absent), "Jitter" or "RSample", as DeepSpeed spells them.
NoisyGatePolicy parse_noisy_gate_policy(const std::string& name);
// DeepSpeed's spelling of `policy` ("None", "Jitter", "RSample").
std::string to_string(NoisyGatePolicy policy);

// deepspeed.moe.layer.MoE's gating arguments, with DeepSpeed's defaults.
struct GateConfig {
  int k = 1;  // 1 or 2
  double capacity_factor = 1.0;
  double eval_capacity_factor = 1.0;
  int64_t min_capacity = 4;
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::none;
  bool drop_tokens = true;
  bool use_rts = true;  // top-1 only, as in DeepSpeed
  bool top2_2nd_expert_sampling = true;
};

// Throws unless `config` is usable for `experts` experts; `context` starts the message.
void check_gate_config(const GateConfig& config, int64_t experts, const std::string& context);

// ceil(tokens / experts * factor), at least min_capacity: DeepSpeed's _capacity.
int64_t expert_capacity(int64_t tokens, int64_t experts, double factor, int64_t min_capacity);

// Random draws a routing may use, each empty when unused: Gumbel noise for the logits
// (S x E, row-major; RSample's top-1 choice, top-2's second choice) and uniform
// priorities for random token selection (one per token: only its chosen expert's entry
// of DeepSpeed's S x E draw matters).
struct RoutingNoise {
  std::vector<float> gumbel;
  std::vector<float> priority;
};

// What the gate decided for S tokens and E experts.
struct Routing {
  int64_t tokens = 0, experts = 0, k = 1;
  int64_t capacity = 0;
  // (S x k): the expert of each token's j-th choice, and its slot in that expert's buffer
  // (expert * capacity + position), or -1 when the choice was dropped.
  std::vector<int64_t> expert, slot;
  // (E): tokens each expert received before dropping (DeepSpeed's exp_counts).
  std::vector<int64_t> counts;
  // (E): the fraction of tokens whose first choice is e, before dropping (l_aux's ce).
  std::vector<double> first_choice_fraction;
  int64_t dropped = 0;  // choices dropped for capacity
  // (E x C): the token in each slot, or -1 where a slot is empty.
  std::vector<int64_t> slot_tokens() const;
  // Grows the capacity to `capacity` (at least the current one), each choice keeping its
  // position: expert parallelism without dropping takes the group's largest capacity.
  void widen(int64_t capacity);
};

// Routes S tokens given their gate logits and probabilities (S x E, row-major, f32).
// `training` picks capacity_factor or eval_capacity_factor; `noise` must hold what the
// config uses (RSample: gumbel; top-2 with sampling: gumbel; top-1 with use_rts and
// dropping: priority).
Routing route(const std::vector<float>& logits, const std::vector<float>& probs, int64_t tokens,
              int64_t experts, const GateConfig& config, bool training, const RoutingNoise& noise);

}  // namespace tessera::moe
