#include "models/moe/moe_layer.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "parallel/expert/all_to_all.h"

namespace tessera::moe {
namespace {

constexpr double kJitter = 1e-2;  // DeepSpeed's multiplicative_jitter epsilon

// `rows` (N, C) with one zero row appended: (N + 1, C). Index N reads zeros.
Tensor with_zero_row(const Tensor& rows) {
  return cat({rows, zeros({1, rows.size(1)}, {rows.dtype(), rows.device()})}, 0);
}

}  // namespace

GateLinear::GateLinear(int64_t n_embd, int64_t num_experts)
    : weight_(zeros({num_experts, n_embd})) {
  register_parameter("weight", weight_);
}

Tensor GateLinear::forward(const Tensor& x) const {
  return linear(cast(x, DType::f32), cast(weight_, DType::f32), Tensor());
}

MoeLayer::MoeLayer(int64_t n_embd, int64_t num_experts, const GateConfig& gate, bool use_residual,
                   const std::function<std::unique_ptr<Layer>(int64_t expert)>& make_expert,
                   Generator& gen, DType dtype, parallel::Communicator* expert_group)
    : n_embd_(n_embd),
      num_experts_(num_experts),
      expert_group_(expert_group),
      ep_size_(expert_group ? expert_group->size() : 1),
      ep_rank_(expert_group ? expert_group->rank() : 0),
      config_(gate),
      gen_(gen),
      gate_(n_embd, num_experts),
      experts_(first_local_expert()) {
  check_gate_config(config_, num_experts_, "[moe]");
  TS_CHECK(num_experts_ % ep_size_ == 0, "[moe] num_experts: expected a multiple of ep_size (",
           ep_size_, "), found ", num_experts_);
  register_module("gate", gate_);
  for (int64_t e = 0; e < local_experts(); ++e) {
    experts_.push_back(make_expert(first_local_expert() + e));
  }
  register_module("experts", experts_);
  if (use_residual) {
    residual_mlp_ = make_expert(-1);
    coefficient_ = std::make_unique<Linear>(n_embd, 2, /*bias=*/true, dtype);
    register_module("mlp", *residual_mlp_);
    register_module("coefficient", *coefficient_);
  }
}

RoutingNoise MoeLayer::draw_noise(int64_t tokens) const {
  RoutingNoise noise;
  const bool gumbel =
      (config_.k == 1 && is_training() && config_.noisy_gate_policy == NoisyGatePolicy::rsample) ||
      (config_.k == 2 && config_.top2_2nd_expert_sampling);
  if (gumbel) {
    // Gumbel(0, 1) = -log(-log(U)); U = 0 gives -inf, a choice never made.
    const std::vector<float> u = rand({tokens * num_experts_}, gen_).to_vector<float>();
    noise.gumbel.resize(u.size());
    for (size_t i = 0; i < u.size(); ++i) {
      noise.gumbel[i] = static_cast<float>(-std::log(-std::log(static_cast<double>(u[i]))));
    }
  }
  if (config_.k == 1 && config_.use_rts && config_.drop_tokens) {
    noise.priority = rand({tokens}, gen_).to_vector<float>();
  }
  return noise;
}

void MoeLayer::agree_on_capacity(Routing& routing, Device device) const {
  // The group's largest and (negated) smallest capacity, in one all-reduce.
  const Tensor c = from_vector(std::vector<double>{static_cast<double>(routing.capacity),
                                                   -static_cast<double>(routing.capacity)},
                               {2})
                       .to(device);
  expert_group_->all_reduce(c, parallel::ReduceOp::max);
  const std::vector<double> v = c.to(Device::cpu()).to_vector<double>();
  const auto largest = static_cast<int64_t>(v[0]), smallest = static_cast<int64_t>(-v[1]);
  if (config_.drop_tokens) {
    TS_CHECK(largest == smallest, "[moe] expert parallelism with drop_tokens: expected every ",
             "rank of the group to route as many tokens (one capacity), found capacities ",
             smallest, " to ", largest);
    return;
  }
  routing.widen(largest);  // one capacity for the group: its largest
}

Tensor MoeLayer::run_experts(const Tensor& buffers, int64_t C) const {
  const int64_t P = ep_size_, L = local_experts();
  // (E * C, C) -> (P * L * C, C): from every rank, its rows for this rank's experts.
  const Tensor mine = P > 1 ? parallel::all_to_all_rows(buffers, *expert_group_) : buffers;
  const Tensor by_rank = reshape(mine, {P, L * C, n_embd_});
  std::vector<Tensor> outputs;  // per local expert (P, C, C)
  outputs.reserve(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const auto& expert = static_cast<const Layer&>(experts_[static_cast<size_t>(l)]);
    const Tensor rows = reshape(narrow(by_rank, 1, l * C, C), {P * C, n_embd_});
    outputs.push_back(reshape(expert(rows), {P, C, n_embd_}));
  }
  // (P, L * C, C) -> (P * L * C, C), back to the ranks whose tokens they are: (E * C, C).
  const Tensor done = reshape(cat(outputs, 1), {P * L * C, n_embd_});
  return P > 1 ? parallel::all_to_all_rows(done, *expert_group_) : done;
}

MoeOutput MoeLayer::forward(const Tensor& x) const {
  TS_CHECK(x.dim() >= 1 && x.size(-1) == n_embd_, "[moe] expected an input of (..., ", n_embd_,
           "), found ", shape_str(x.shape()));
  const int64_t S = x.numel() / n_embd_, E = num_experts_;
  TS_CHECK(S > 0, "[moe] expected at least one token, found none");
  const Tensor tokens = reshape(x, {S, n_embd_});  // (S, C)

  // Gate, in f32 (Note [MoE routing]).
  Tensor gate_in = cast(tokens, DType::f32);
  if (is_training() && config_.noisy_gate_policy == NoisyGatePolicy::jitter) {
    gate_in = mul(gate_in,
                  rand({S, n_embd_}, gen_, {DType::f32, x.device()}, 1.0 - kJitter, 1.0 + kJitter));
  }
  const Tensor logits = gate_(gate_in);  // (S, E) f32
  const Tensor probs = softmax(logits);  // (S, E) f32
  MoeOutput out;
  {
    NoGradGuard no_grad;
    out.routing = route(logits.to(Device::cpu()).to_vector<float>(),
                        probs.to(Device::cpu()).to_vector<float>(), S, E, config_, is_training(),
                        draw_noise(S));
  }
  if (ep_size_ > 1) agree_on_capacity(out.routing, x.device());
  const Routing& r = out.routing;
  const int64_t C = r.capacity, k = r.k;

  // l_aux = E * sum_e mean_s(probs) * (first choices' fraction).
  std::vector<float> fraction(r.first_choice_fraction.begin(), r.first_choice_fraction.end());
  const Tensor ce = from_vector(fraction).to(x.device());
  out.l_aux = mul(sum(mul(mean(probs, {0}), ce)), scalar_like(ce, static_cast<double>(E)));

  // Dispatch: slot (e, c) reads its token's row, or the zero row at S.
  std::vector<int64_t> reads = r.slot_tokens();
  for (int64_t& t : reads) t = t < 0 ? S : t;
  const Tensor buffers = index_select(with_zero_row(tokens), 0, from_vector(reads).to(x.device()));

  const Tensor expert_rows = with_zero_row(run_experts(buffers, C));  // (E * C + 1, C)

  // Combine: each choice reads its slot's row and its probability, or, dropped, the zero
  // row and a zero appended to the probabilities.
  const Tensor flat_probs = cat({reshape(probs, {S * E}), zeros({1}, {DType::f32, x.device()})}, 0);
  std::vector<Tensor> picked(static_cast<size_t>(k)), weight(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    std::vector<int64_t> rows(static_cast<size_t>(S)), at(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) {
      const int64_t slot = r.slot[static_cast<size_t>(s * k + j)];
      rows[static_cast<size_t>(s)] = slot < 0 ? E * C : slot;
      at[static_cast<size_t>(s)] =
          slot < 0 ? S * E : s * E + r.expert[static_cast<size_t>(s * k + j)];
    }
    picked[static_cast<size_t>(j)] = index_select(expert_rows, 0, from_vector(rows).to(x.device()));
    weight[static_cast<size_t>(j)] = index_select(flat_probs, 0, from_vector(at).to(x.device()));
  }
  if (k == 2) {
    // p_j / (p1 + p2) over the kept choices (a dropped one weighs 0 already), the sum clamped
    // below at f32's epsilon (DeepSpeed's clamp: a token with none kept weighs 0).
    const Tensor both = add(weight[0], weight[1]);
    const Tensor eps = scalar_like(both, std::numeric_limits<float>::epsilon());
    const Tensor denom = where(lt(both, eps), eps, both);
    weight[0] = div(weight[0], denom);
    weight[1] = div(weight[1], denom);
  }
  Tensor y;
  for (int64_t j = 0; j < k; ++j) {
    const Tensor w = unsqueeze(cast(weight[static_cast<size_t>(j)], x.dtype()), 1);  // (S, 1)
    const Tensor term = mul(picked[static_cast<size_t>(j)], w);
    y = j == 0 ? term : add(y, term);
  }

  if (residual_mlp_) {
    const Tensor dense = (*residual_mlp_)(tokens);
    const Tensor c = softmax((*coefficient_)(tokens));  // (S, 2)
    y = add(mul(y, narrow(c, 1, 0, 1)), mul(dense, narrow(c, 1, 1, 1)));
  }
  out.output = reshape(y, x.shape());
  return out;
}

}  // namespace tessera::moe
