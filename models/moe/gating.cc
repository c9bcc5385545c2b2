#include "models/moe/gating.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera::moe {
namespace {

// The index of the largest of n values at `row` (the first on ties, as torch.argmax),
// skipping `excluded` (-1: none).
int64_t argmax_row(const float* row, int64_t n, int64_t excluded) {
  int64_t best = -1;
  for (int64_t e = 0; e < n; ++e) {
    if (e == excluded) continue;
    if (best < 0 || row[e] > row[best]) best = e;
  }
  return best;
}

}  // namespace

NoisyGatePolicy parse_noisy_gate_policy(const std::string& name) {
  if (name.empty() || name == "None") return NoisyGatePolicy::none;
  if (name == "Jitter") return NoisyGatePolicy::jitter;
  if (name == "RSample") return NoisyGatePolicy::rsample;
  TS_FAIL("noisy_gate_policy: expected \"None\", \"Jitter\" or \"RSample\", found \"", name, "\"");
}

std::string to_string(NoisyGatePolicy policy) {
  switch (policy) {
    case NoisyGatePolicy::none:
      return "None";
    case NoisyGatePolicy::jitter:
      return "Jitter";
    case NoisyGatePolicy::rsample:
      return "RSample";
  }
  return "?";
}

void check_gate_config(const GateConfig& config, int64_t experts, const std::string& context) {
  TS_CHECK(experts >= 1, context, " num_experts: expected at least 1, found ", experts);
  TS_CHECK(config.k == 1 || config.k == 2, context,
           " k: expected 1 or 2 (top-1 or top-2 gating), found ", config.k);
  TS_CHECK(config.k <= experts, context, " k: expected at most num_experts (", experts, "), found ",
           config.k);
  TS_CHECK(config.capacity_factor > 0 && std::isfinite(config.capacity_factor), context,
           " capacity_factor: expected a positive number, found ", config.capacity_factor);
  TS_CHECK(config.eval_capacity_factor > 0 && std::isfinite(config.eval_capacity_factor), context,
           " eval_capacity_factor: expected a positive number, found ",
           config.eval_capacity_factor);
  TS_CHECK(config.min_capacity >= 0, context, " min_capacity: expected at least 0, found ",
           config.min_capacity);
  TS_CHECK(config.k == 1 || config.noisy_gate_policy != NoisyGatePolicy::rsample, context,
           " noisy_gate_policy: \"RSample\" picks top-1 experts; top-2 samples its second "
           "expert with top2_2nd_expert_sampling instead");
}

int64_t expert_capacity(int64_t tokens, int64_t experts, double factor, int64_t min_capacity) {
  // In f32, as DeepSpeed's _capacity multiplies by torch.tensor(capacity_factor): 40 tokens
  // over 4 experts at 1.1 give 11 there (f64 would give 12).
  const float per_expert =
      static_cast<float>(static_cast<double>(tokens) / static_cast<double>(experts));
  const auto c = static_cast<int64_t>(std::ceil(per_expert * static_cast<float>(factor)));
  return std::max(c, min_capacity);
}

std::vector<int64_t> Routing::slot_tokens() const {
  std::vector<int64_t> tokens_at(static_cast<size_t>(experts * capacity), -1);
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (slot[static_cast<size_t>(i)] >= 0)
      tokens_at[static_cast<size_t>(slot[static_cast<size_t>(i)])] = i / k;
  }
  return tokens_at;
}

void Routing::widen(int64_t new_capacity) {
  TS_CHECK(new_capacity >= capacity, "[moe] routing: a capacity of ", capacity,
           " cannot shrink to ", new_capacity);
  for (int64_t& s : slot) {
    if (s >= 0) s = s / capacity * new_capacity + s % capacity;
  }
  capacity = new_capacity;
}

Routing route(const std::vector<float>& logits, const std::vector<float>& probs, int64_t tokens,
              int64_t experts, const GateConfig& config, bool training, const RoutingNoise& noise) {
  const int64_t S = tokens, E = experts, k = config.k;
  TS_CHECK(static_cast<int64_t>(probs.size()) == S * E && logits.size() == probs.size(),
           "[moe] routing: expected ", S, " x ", E, " logits and probabilities, found ",
           logits.size(), " and ", probs.size());
  const bool rsample = training && config.noisy_gate_policy == NoisyGatePolicy::rsample;
  const bool sample_second = k == 2 && config.top2_2nd_expert_sampling;
  TS_CHECK(!(rsample || sample_second) || static_cast<int64_t>(noise.gumbel.size()) == S * E,
           "[moe] routing: expected ", S * E, " Gumbel draws, found ", noise.gumbel.size());
  const bool random_selection = k == 1 && config.use_rts && config.drop_tokens;
  TS_CHECK(!random_selection || static_cast<int64_t>(noise.priority.size()) == S,
           "[moe] routing: expected ", S, " random priorities, found ", noise.priority.size());
  // DeepSpeed asserts this for top-1: fewer tokens than min_capacity cannot fill it. Not
  // when evaluating: generation routes a few tokens at a time (none is dropped then, as
  // C >= min_capacity > S).
  TS_CHECK(k != 1 || !training || S >= config.min_capacity, "[moe] top-1 gating of ", S,
           " tokens: expected at least min_capacity (", config.min_capacity,
           ") tokens; set min_capacity lower or give more tokens");

  Routing r;
  r.tokens = S;
  r.experts = E;
  r.k = k;
  r.expert.assign(static_cast<size_t>(S * k), -1);
  r.slot.assign(static_cast<size_t>(S * k), -1);
  r.counts.assign(static_cast<size_t>(E), 0);
  r.first_choice_fraction.assign(static_cast<size_t>(E), 0.0);

  // Choices.
  std::vector<float> noisy(static_cast<size_t>(E));
  for (int64_t s = 0; s < S; ++s) {
    const float* p = probs.data() + s * E;
    const float* l = logits.data() + s * E;
    int64_t first = argmax_row(p, E, -1);
    if (rsample) {
      for (int64_t e = 0; e < E; ++e)
        noisy[static_cast<size_t>(e)] = l[e] + noise.gumbel[static_cast<size_t>(s * E + e)];
      first = argmax_row(noisy.data(), E, -1);
    }
    r.expert[static_cast<size_t>(s * k)] = first;
    ++r.counts[static_cast<size_t>(first)];
    r.first_choice_fraction[static_cast<size_t>(first)] += 1.0;  // a count until the end
    if (k == 2) {
      for (int64_t e = 0; e < E; ++e) {
        noisy[static_cast<size_t>(e)] =
            l[e] + (sample_second ? noise.gumbel[static_cast<size_t>(s * E + e)] : 0.0f);
      }
      const int64_t second = argmax_row(noisy.data(), E, first);
      r.expert[static_cast<size_t>(s * k + 1)] = second;
      ++r.counts[static_cast<size_t>(second)];
    }
  }

  for (double& f : r.first_choice_fraction) f /= static_cast<double>(S);

  // Capacity.
  if (config.drop_tokens) {
    const double factor = training ? config.capacity_factor : config.eval_capacity_factor;
    r.capacity = expert_capacity(S, E, factor * static_cast<double>(k), config.min_capacity);
  } else {
    r.capacity = *std::max_element(r.counts.begin(), r.counts.end());
  }
  const int64_t C = r.capacity;

  // Slots.
  if (k == 1) {
    // Each expert's tokens in token order; with random selection the C of highest
    // priority are kept (ties: the earlier token), then slotted in token order.
    std::vector<std::vector<int64_t>> of_expert(static_cast<size_t>(E));
    for (int64_t s = 0; s < S; ++s)
      of_expert[static_cast<size_t>(r.expert[static_cast<size_t>(s)])].push_back(s);
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int64_t>& mine = of_expert[static_cast<size_t>(e)];
      if (static_cast<int64_t>(mine.size()) > C && random_selection) {
        std::stable_sort(mine.begin(), mine.end(), [&](int64_t a, int64_t b) {
          return noise.priority[static_cast<size_t>(a)] > noise.priority[static_cast<size_t>(b)];
        });
        mine.resize(static_cast<size_t>(C));
        std::sort(mine.begin(), mine.end());
      }
      for (int64_t pos = 0; pos < static_cast<int64_t>(mine.size()); ++pos) {
        if (pos < C) r.slot[static_cast<size_t>(mine[static_cast<size_t>(pos)])] = e * C + pos;
      }
    }
  } else {
    std::vector<int64_t> next(static_cast<size_t>(E), 0);  // first choices, in token order
    for (int64_t s = 0; s < S; ++s) {
      const int64_t e = r.expert[static_cast<size_t>(s * 2)];
      const int64_t pos = next[static_cast<size_t>(e)]++;
      if (pos < C) r.slot[static_cast<size_t>(s * 2)] = e * C + pos;
    }
    // Second choices queue after all first choices, dropped ones included.
    for (int64_t s = 0; s < S; ++s) {
      const int64_t e = r.expert[static_cast<size_t>(s * 2 + 1)];
      const int64_t pos = next[static_cast<size_t>(e)]++;
      if (pos < C) r.slot[static_cast<size_t>(s * 2 + 1)] = e * C + pos;
    }
  }
  r.dropped = std::count(r.slot.begin(), r.slot.end(), int64_t{-1});
  return r;
}

}  // namespace tessera::moe
