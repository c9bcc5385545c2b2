// Top-1 and top-2 routing (models/moe/gating.h) against per-token loops written from
// DeepSpeed's top1gating and top2gating (deepspeed/moe/sharded_moe.py).
#include "models/moe/gating.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

namespace tessera::moe {
namespace {

// S x E logits and their softmax; `skew` adds to expert 0's logit (skewed routing).
struct Gate {
  std::vector<float> logits, probs;
};
Gate random_gate(int64_t S, int64_t E, uint32_t seed, float skew = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Gate g;
  for (int64_t s = 0; s < S; ++s) {
    double total = 0;
    std::vector<double> ex(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const float l = normal(rng) + (e == 0 ? skew : 0.0f);
      g.logits.push_back(l);
      ex[static_cast<size_t>(e)] = std::exp(static_cast<double>(l));
      total += ex[static_cast<size_t>(e)];
    }
    for (double v : ex) g.probs.push_back(static_cast<float>(v / total));
  }
  return g;
}

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// The expert with the largest value in row s, skipping `skip`.
int64_t best(const std::vector<float>& m, int64_t s, int64_t E, int64_t skip = -1) {
  int64_t b = -1;
  for (int64_t e = 0; e < E; ++e) {
    if (e != skip &&
        (b < 0 || m[static_cast<size_t>(s * E + e)] > m[static_cast<size_t>(s * E + b)]))
      b = e;
  }
  return b;
}

// Top-1 by a per-token loop: tokens claim their expert's slots in order until C are taken;
// with priorities, an expert keeps the C tokens of highest priority and slots them in order.
Routing naive_top1(const Gate& g, int64_t S, int64_t E, int64_t C,
                   const std::vector<float>* priority) {
  Routing r;
  r.tokens = S, r.experts = E, r.k = 1, r.capacity = C;
  r.counts.assign(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t e = best(g.probs, s, E);
    r.expert.push_back(e);
    ++r.counts[static_cast<size_t>(e)];
  }
  r.slot.assign(static_cast<size_t>(S), -1);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<bool> keep(static_cast<size_t>(S), false);
    int64_t taken = 0;
    if (priority == nullptr) {
      for (int64_t s = 0; s < S; ++s) {
        if (r.expert[static_cast<size_t>(s)] == e && taken < C)
          keep[static_cast<size_t>(s)] = true, ++taken;
      }
    } else {
      for (int64_t round = 0; round < C; ++round) {  // the best remaining token, C times
        int64_t pick = -1;
        for (int64_t s = 0; s < S; ++s) {
          if (r.expert[static_cast<size_t>(s)] != e || keep[static_cast<size_t>(s)]) continue;
          if (pick < 0 ||
              (*priority)[static_cast<size_t>(s)] > (*priority)[static_cast<size_t>(pick)])
            pick = s;
        }
        if (pick >= 0) keep[static_cast<size_t>(pick)] = true;
      }
    }
    int64_t position = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (keep[static_cast<size_t>(s)]) r.slot[static_cast<size_t>(s)] = e * C + position++;
    }
  }
  r.dropped = std::count(r.slot.begin(), r.slot.end(), -1);
  return r;
}

// Top-2 by a per-token loop: first choices in token order, then second choices.
Routing naive_top2(const Gate& g, int64_t S, int64_t E, int64_t C,
                   const std::vector<float>* gumbel) {
  Routing r;
  r.tokens = S, r.experts = E, r.k = 2, r.capacity = C;
  r.counts.assign(static_cast<size_t>(E), 0);
  std::vector<float> second = g.logits;
  if (gumbel) {
    for (size_t i = 0; i < second.size(); ++i) second[i] += (*gumbel)[i];
  }
  for (int64_t s = 0; s < S; ++s) {
    const int64_t e1 = best(g.probs, s, E);
    r.expert.push_back(e1);
    r.expert.push_back(best(second, s, E, e1));
  }
  r.slot.assign(static_cast<size_t>(2 * S), -1);
  std::vector<int64_t> used(static_cast<size_t>(E), 0);
  for (int64_t j = 0; j < 2; ++j) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t e = r.expert[static_cast<size_t>(2 * s + j)];
      ++r.counts[static_cast<size_t>(e)];
      const int64_t position = used[static_cast<size_t>(e)]++;
      if (position < C) r.slot[static_cast<size_t>(2 * s + j)] = e * C + position;
    }
  }
  r.dropped = std::count(r.slot.begin(), r.slot.end(), -1);
  return r;
}

void check_same(const Routing& got, const Routing& want) {
  CHECK(got.capacity == want.capacity);
  CHECK(got.expert == want.expert);
  CHECK(got.slot == want.slot);
  CHECK(got.counts == want.counts);
  CHECK(got.dropped == want.dropped);
}

TEST_CASE("capacity is DeepSpeed's ceil(S / E * factor), at least min_capacity", "[moe]") {
  CHECK(expert_capacity(10, 4, 1.0, 0) == 3);
  CHECK(expert_capacity(10, 4, 1.0, 4) == 4);
  CHECK(expert_capacity(10, 4, 1.5, 0) == 4);   // ceil(3.75)
  CHECK(expert_capacity(64, 8, 2.0, 4) == 16);  // top-2 doubles the factor
  CHECK(expert_capacity(1024, 8, 1.25, 4) == 160);
  CHECK(expert_capacity(40, 4, 1.1, 0) == 11);  // f32, as DeepSpeed: 10 x 1.1f rounds to 11
}

TEST_CASE("top-1 routing keeps the first C tokens per expert, or the C of highest priority",
          "[moe]") {
  const int64_t S = 48, E = 4;
  for (float skew : {0.0f, 2.0f}) {
    const Gate g = random_gate(S, E, 11, skew);
    GateConfig cfg;
    cfg.capacity_factor = 1.0;
    cfg.min_capacity = 0;
    const int64_t C = expert_capacity(S, E, 1.0, 0);
    cfg.use_rts = false;
    const Routing positional = route(g.logits, g.probs, S, E, cfg, true, {});
    check_same(positional, naive_top1(g, S, E, C, nullptr));
    if (skew > 0) CHECK(positional.dropped > 0);  // skewed: expert 0 overflows
    cfg.use_rts = true;
    const std::vector<float> priority = uniform(S, 5);
    const Routing random = route(g.logits, g.probs, S, E, cfg, true, {{}, priority});
    check_same(random, naive_top1(g, S, E, C, &priority));
    CHECK(random.dropped == positional.dropped);  // the same count, other tokens
    // first_choice_fraction is l_aux's ce: counts / S before dropping.
    for (int64_t e = 0; e < E; ++e) {
      CHECK(random.first_choice_fraction[static_cast<size_t>(e)] ==
            Approx(static_cast<double>(random.counts[static_cast<size_t>(e)]) / S));
    }
  }
}

TEST_CASE("top-1 with RSample picks argmax(logits + Gumbel) in training only", "[moe]") {
  const int64_t S = 16, E = 4;
  const Gate g = random_gate(S, E, 3);
  GateConfig cfg;
  cfg.noisy_gate_policy = NoisyGatePolicy::rsample;
  cfg.drop_tokens = false;
  std::vector<float> gumbel = uniform(S * E, 9);
  for (float& v : gumbel) v = 10.0f * v;  // large enough to change choices
  const Routing train = route(g.logits, g.probs, S, E, cfg, true, {gumbel, {}});
  const Routing eval = route(g.logits, g.probs, S, E, cfg, false, {});
  int changed = 0;
  for (int64_t s = 0; s < S; ++s) {
    std::vector<float> noisy(g.logits.begin() + s * E, g.logits.begin() + (s + 1) * E);
    for (int64_t e = 0; e < E; ++e)
      noisy[static_cast<size_t>(e)] += gumbel[static_cast<size_t>(s * E + e)];
    CHECK(train.expert[static_cast<size_t>(s)] == best(noisy, 0, E));
    CHECK(eval.expert[static_cast<size_t>(s)] == best(g.probs, s, E));
    changed += train.expert[static_cast<size_t>(s)] != eval.expert[static_cast<size_t>(s)];
  }
  CHECK(changed > 0);
  CHECK(train.dropped == 0);
}

TEST_CASE("top-2 routing queues second choices after all first choices", "[moe]") {
  const int64_t S = 40, E = 5;
  for (float skew : {0.0f, 3.0f}) {
    const Gate g = random_gate(S, E, 21, skew);
    GateConfig cfg;
    cfg.k = 2;
    cfg.min_capacity = 0;
    cfg.capacity_factor = 0.75;
    const int64_t C = expert_capacity(S, E, 1.5, 0);
    cfg.top2_2nd_expert_sampling = false;
    check_same(route(g.logits, g.probs, S, E, cfg, true, {}), naive_top2(g, S, E, C, nullptr));
    cfg.top2_2nd_expert_sampling = true;
    const std::vector<float> gumbel = uniform(S * E, 4);
    check_same(route(g.logits, g.probs, S, E, cfg, true, {gumbel, {}}),
               naive_top2(g, S, E, C, &gumbel));
    // Evaluation uses eval_capacity_factor.
    cfg.eval_capacity_factor = 2.0;
    check_same(route(g.logits, g.probs, S, E, cfg, false, {gumbel, {}}),
               naive_top2(g, S, E, expert_capacity(S, E, 4.0, 0), &gumbel));
  }
}

TEST_CASE("without drop_tokens the capacity is the largest expert load and nothing drops",
          "[moe]") {
  const int64_t S = 30, E = 3;
  const Gate g = random_gate(S, E, 8, 2.0f);
  for (int k : {1, 2}) {
    GateConfig cfg;
    cfg.k = k;
    cfg.drop_tokens = false;
    cfg.top2_2nd_expert_sampling = false;
    const Routing r = route(g.logits, g.probs, S, E, cfg, true, {});
    CHECK(r.dropped == 0);
    CHECK(r.capacity == *std::max_element(r.counts.begin(), r.counts.end()));
    std::vector<int64_t> slots = r.slot;
    std::sort(slots.begin(), slots.end());
    CHECK(std::adjacent_find(slots.begin(), slots.end()) == slots.end());  // no slot twice
  }
}

TEST_CASE("slot_tokens lists each slot's token, -1 where empty", "[moe]") {
  const Gate g = random_gate(12, 3, 2);
  GateConfig cfg;
  cfg.use_rts = false;
  cfg.min_capacity = 0;
  const Routing r = route(g.logits, g.probs, 12, 3, cfg, true, {});
  const std::vector<int64_t> tokens = r.slot_tokens();
  REQUIRE(tokens.size() == static_cast<size_t>(3 * r.capacity));
  for (int64_t s = 0; s < 12; ++s) {
    if (r.slot[static_cast<size_t>(s)] >= 0)
      CHECK(tokens[static_cast<size_t>(r.slot[static_cast<size_t>(s)])] == s);
  }
  CHECK(std::count(tokens.begin(), tokens.end(), -1) == 3 * r.capacity - (12 - r.dropped));
}

TEST_CASE("bad gate settings and inputs are refused with the reason", "[moe]") {
  GateConfig cfg;
  cfg.k = 3;
  CHECK_THROWS_WITH(check_gate_config(cfg, 8, "[moe]"), Catch::Contains("expected 1 or 2"));
  cfg.k = 2;
  CHECK_THROWS_WITH(check_gate_config(cfg, 1, "[moe]"), Catch::Contains("at most num_experts"));
  cfg.noisy_gate_policy = NoisyGatePolicy::rsample;
  CHECK_THROWS_WITH(check_gate_config(cfg, 4, "[moe]"), Catch::Contains("RSample"));
  CHECK_THROWS_WITH(parse_noisy_gate_policy("gumbel"), Catch::Contains("\"Jitter\""));
  CHECK(parse_noisy_gate_policy("Jitter") == NoisyGatePolicy::jitter);
  GateConfig one;  // min_capacity 4
  const Gate g = random_gate(3, 2, 1);
  CHECK_THROWS_WITH(route(g.logits, g.probs, 3, 2, one, true, {{}, uniform(3, 1)}),
                    Catch::Contains("at least min_capacity (4)"));
  one.min_capacity = 0;
  CHECK_THROWS_WITH(route(g.logits, g.probs, 3, 2, one, true, {}),
                    Catch::Contains("random priorities"));
}

}  // namespace
}  // namespace tessera::moe
