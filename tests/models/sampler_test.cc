// Sampling (models/gpt2/sampler.h): sample_token's greedy, temperature, top-k and top-p
// rules against hand-worked cases and the softmax distribution, never a padding id; and
// sample() with the KV cache against a naive sampler that re-runs forward on the context.
#include "models/gpt2/sampler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/philox.h"
#include "tests/testing.h"
#include "tests/tiny_gpt.h"

namespace tessera {
namespace {

using Catch::Contains;
using testing::error_of;

SamplingOptions opts(double temperature, int64_t top_k = 0, double top_p = 1.0) {
  return SamplingOptions{temperature, top_k, top_p, 0};
}

// u in [0, 1) on a grid of n points: frequencies over it are exact up to 1 / n.
std::vector<double> u_grid(int n) {
  std::vector<double> u(n);
  for (int i = 0; i < n; ++i) u[i] = (i + 0.5) / n;
  return u;
}

// The distribution sample_token should draw from, written from the definitions: softmax of
// logits / T, the k most likely, then the smallest most-likely-first set reaching top_p.
std::vector<double> expected_distribution(const std::vector<float>& logits,
                                          const SamplingOptions& o) {
  const size_t v = logits.size();
  std::vector<double> p(v);
  const double top = *std::max_element(logits.begin(), logits.end());
  for (size_t i = 0; i < v; ++i) p[i] = std::exp((logits[i] - top) / o.temperature);
  std::vector<size_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  size_t keep = o.top_k > 0 ? std::min(v, static_cast<size_t>(o.top_k)) : v;
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[order[i]];
  double mass = 0;
  size_t n = 0;
  while (n < keep && mass < o.top_p * total) mass += p[order[n++]];
  keep = n;
  std::vector<double> want(v, 0.0);
  for (size_t i = 0; i < keep; ++i) want[order[i]] = p[order[i]] / mass;
  return want;
}

std::vector<double> frequencies(const std::vector<float>& logits, const SamplingOptions& o,
                                const std::vector<double>& us) {
  std::vector<double> f(logits.size(), 0.0);
  for (double u : us) {
    const int32_t id = sample_token(logits.data(), static_cast<int64_t>(logits.size()), o, u);
    if (id < 0 || id >= static_cast<int32_t>(logits.size())) FAIL("id " << id << " out of range");
    f[id] += 1.0 / static_cast<double>(us.size());
  }
  return f;
}

const std::vector<float> kLogits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f};  // argmax 4

TEST_CASE("greedy, top_k = 1 and a tiny top_p all return the argmax", "[sampler]") {
  Generator gen(17);
  const std::vector<float> logits = randn({1000}, gen).to_vector<float>();
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  for (double u : {0.0, 0.1, 0.5, 0.999999}) {
    CHECK(sample_token(logits.data(), 1000, opts(0.0), u) == argmax);
    CHECK(sample_token(logits.data(), 1000, opts(1.0, 1), u) == argmax);
    CHECK(sample_token(logits.data(), 1000, opts(3.0, 1), u) == argmax);
    CHECK(sample_token(logits.data(), 1000, opts(1.0, 0, 1e-6), u) == argmax);
    CHECK(sample_token(logits.data(), 1000, opts(1.0, 50, 1e-6), u) == argmax);
  }
  // Ties go to the lowest id.
  const std::vector<float> tie = {0.f, 5.f, 1.f, 5.f};
  CHECK(sample_token(tie.data(), 4, opts(0.0), 0.7) == 1);
}

TEST_CASE("temperature scales the logits before the softmax", "[sampler]") {
  // Logits {0, 1}: token 1 has probability e^(1/T) / (1 + e^(1/T)) and comes first.
  const std::vector<float> two = {0.0f, 1.0f};
  const double p_half = std::exp(2.0) / (1.0 + std::exp(2.0));  // T = 0.5: 0.8808
  const double p_two = std::exp(0.5) / (1.0 + std::exp(0.5));   // T = 2: 0.6225
  CHECK(sample_token(two.data(), 2, opts(0.5), p_half - 1e-4) == 1);
  CHECK(sample_token(two.data(), 2, opts(0.5), p_half + 1e-4) == 0);
  CHECK(sample_token(two.data(), 2, opts(2.0), p_two - 1e-4) == 1);
  CHECK(sample_token(two.data(), 2, opts(2.0), p_two + 1e-4) == 0);
  // A very high temperature is close to uniform; a very low one is greedy.
  const std::vector<double> hot = frequencies(kLogits, opts(1e4), u_grid(60000));
  for (double f : hot) CHECK(f == Approx(1.0 / 6).margin(1e-3));
  const std::vector<double> cold = frequencies(kLogits, opts(1e-3), u_grid(1000));
  CHECK(cold[4] == Approx(1.0));
}

TEST_CASE("frequencies over many u match the softmax distribution", "[sampler]") {
  const std::vector<double> grid = u_grid(100000);
  // Draws the way sample() makes them: Philox words mapped to [0, 1).
  std::vector<double> drawn;
  for (uint64_t i = 0; i < 40000; ++i) drawn.push_back(uniform_from_bits(philox4x32(i, 0, 99)[0]));
  for (const SamplingOptions& o : {opts(1.0), opts(0.5), opts(2.0, 3), opts(1.0, 0, 0.8),
                                   opts(1.0, 0, 0.9), opts(1.5, 4, 0.7)}) {
    INFO("temperature " << o.temperature << ", top_k " << o.top_k << ", top_p " << o.top_p);
    const std::vector<double> want = expected_distribution(kLogits, o);
    CHECK(testing::max_abs_diff(frequencies(kLogits, o, grid), want) < 1e-4);
    // 40000 draws: the standard error of a frequency is at most 0.0025.
    CHECK(testing::max_abs_diff(frequencies(kLogits, o, drawn), want) < 0.0125);
  }
  // The hand-worked top_p = 0.8 case: probabilities .605, .222, .082, ...: {4, 1} reach 0.8.
  const std::vector<double> p8 = expected_distribution(kLogits, opts(1.0, 0, 0.8));
  CHECK(p8[4] + p8[1] == Approx(1.0));
  CHECK(p8[4] == Approx(std::exp(3.0) / (std::exp(3.0) + std::exp(2.0))));
}

TEST_CASE("huge padding logits are never sampled", "[sampler]") {
  // 10 real tokens padded to 16; the padding logits dwarf every real one.
  std::vector<float> logits(16, 1e30f);
  for (int i = 0; i < 10; ++i) logits[i] = static_cast<float>(i % 3);
  for (const SamplingOptions& o : {opts(0.0), opts(1.0), opts(5.0, 3), opts(1.0, 0, 0.5)}) {
    for (double u : u_grid(997)) CHECK(sample_token(logits.data(), 10, o, u) < 10);
  }
}

GptConfig tiny() { return testing::tiny_gpt_config(13); }

std::unique_ptr<Gpt> spread_model(uint64_t seed) { return testing::spread_gpt(tiny(), seed); }

// The argmax over the real vocabulary of the last position's logits, recomputed with a
// full forward over `context`; checks that the choice is not a near tie.
int32_t naive_greedy_next(const Gpt& model, const std::vector<int32_t>& context) {
  NoGradGuard no_grad;
  const int64_t t = static_cast<int64_t>(context.size());
  const Tensor logits = model.forward(from_vector(context, {1, t}));  // (1, T, Vp)
  std::vector<float> last = logits.select(1, t - 1).contiguous().to_vector<float>();
  last.resize(static_cast<size_t>(model.config().vocab_size));
  std::vector<float> sorted = last;
  std::sort(sorted.rbegin(), sorted.rend());
  REQUIRE(sorted[0] - sorted[1] > 1e-3f);
  return static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
}

TEST_CASE("sample() with the KV cache draws what a naive full-context sampler does", "[sampler]") {
  const GptConfig cfg = tiny();
  for (uint64_t seed : {1, 2, 3}) {
    const std::unique_ptr<Gpt> model = spread_model(seed);
    for (const std::vector<int32_t>& prompt :
         {std::vector<int32_t>{0}, std::vector<int32_t>{3, 1, 4, 1, 5}}) {
      // Up to a context of exactly block_size: the last draw uses a full cache.
      const int64_t n = cfg.block_size - static_cast<int64_t>(prompt.size()) + 1;
      std::vector<int32_t> seen;
      const std::vector<int32_t> got =
          sample(*model, prompt, n, opts(0.0), [&](int32_t id) { seen.push_back(id); });
      CHECK(seen == got);
      std::vector<int32_t> context = prompt, want;
      for (int64_t i = 0; i < n; ++i) {
        want.push_back(naive_greedy_next(*model, context));
        context.push_back(want.back());
      }
      INFO("seed " << seed << ", prompt of " << prompt.size());
      CHECK(got == want);
    }
  }
}

TEST_CASE("sample() runs past block_size with a sliding window of block_size / 2", "[sampler]") {
  const GptConfig cfg = tiny();
  const std::unique_ptr<Gpt> model = spread_model(4);
  const std::vector<int32_t> prompt = {2, 7, 1, 8};
  const int64_t n = 3 * cfg.block_size + 5;
  const std::vector<int32_t> got = sample(*model, prompt, n, opts(0.0));
  REQUIRE(static_cast<int64_t>(got.size()) == n);
  // The documented window: when the context reaches block_size the cache restarts from the
  // last block_size / 2 tokens; the naive sampler sees the same tokens.
  std::vector<int32_t> context = prompt, want;
  size_t start = 0;
  for (int64_t i = 0; i < n; ++i) {
    want.push_back(naive_greedy_next(
        *model,
        std::vector<int32_t>(context.begin() + static_cast<std::ptrdiff_t>(start), context.end())));
    context.push_back(want.back());
    if (context.size() - 1 - start == static_cast<size_t>(cfg.block_size)) {
      start = context.size() - static_cast<size_t>(cfg.block_size / 2);
    }
  }
  CHECK(got == want);
  // Random draws past block_size: right count, ids in range.
  const std::vector<int32_t> drawn = sample(*model, prompt, n, SamplingOptions{1.0, 5, 0.95, 3});
  REQUIRE(static_cast<int64_t>(drawn.size()) == n);
  for (int32_t id : drawn) CHECK((id >= 0 && id < cfg.vocab_size));
  // A prompt longer than block_size keeps its last block_size tokens.
  std::vector<int32_t> long_prompt(40);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<int32_t>(i % 13);
  CHECK(sample(*model, long_prompt, 1, opts(0.0))[0] ==
        naive_greedy_next(
            *model, std::vector<int32_t>(long_prompt.end() - cfg.block_size, long_prompt.end())));
}

TEST_CASE("sample() never draws vocabulary padding, even when its logits are huge", "[sampler]") {
  const GptConfig cfg = tiny();
  Gpt model(cfg, 6);
  model.eval();
  {
    // ln_f outputs all ones, and the (tied) padding rows of the head are 1000: every
    // padding logit is 16000, far above the real ones.
    NoGradGuard no_grad;
    for (const NamedParameter& p : model.named_parameters()) {
      if (p.name == "transformer.ln_f.weight") p.tensor.fill_(0.0);
      if (p.name == "transformer.ln_f.bias") p.tensor.fill_(1.0);
      if (p.name == "transformer.wte.weight") {
        p.tensor.narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size).fill_(1000.0);
      }
    }
    const Tensor logits = model.forward(from_vector(std::vector<int32_t>{1, 2}, {1, 2}));
    const std::vector<float> last = logits.select(1, 1).contiguous().to_vector<float>();
    REQUIRE(std::max_element(last.begin(), last.end()) - last.begin() >= cfg.vocab_size);
  }
  for (const SamplingOptions& o : {opts(0.0), opts(1.0), opts(2.0, 200), opts(1.0, 0, 0.99)}) {
    for (int32_t id : sample(model, {1, 2}, 40, o)) CHECK((id >= 0 && id < cfg.vocab_size));
  }
}

TEST_CASE("sample() rejects empty prompts, unknown ids and bad options", "[sampler]") {
  Gpt model(tiny(), 1);
  CHECK_THAT(error_of([&] { sample(model, {}, 1, opts(1.0)); }), Contains("non-empty prompt"));
  CHECK_THAT(error_of([&] {
               sample(model, {1, 13}, 1, opts(1.0));
             }),
             Contains("prompt token 1 is 13; expected an id in [0, 13)"));
  CHECK_THAT(error_of([&] { sample(model, {1}, 1, opts(-1.0)); }), Contains("temperature >= 0"));
  CHECK_THAT(error_of([&] { sample(model, {1}, 1, opts(1.0, 0, 0.0)); }),
             Contains("top_p in (0, 1]"));
  CHECK(sample(model, {1}, 0, opts(1.0)).empty());
}

}  // namespace
}  // namespace tessera
