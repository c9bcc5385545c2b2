// Dropout on GPT's attention probabilities (Note [Attention dropout] in
// models/gpt2/attention.h) and the streams its masks come from (Note [Model-parallel
// dropout] in parallel/tensor/dropout_streams.h): the layer against naive f64 loops with the
// sliced stream's mask, the fused op's values and gradients against the unfused ops with
// the same draw, evaluation without dropout, the config's rate, and tensor-parallel ranks
// drawing replicated masks alike and sliced masks of their own.
#include <catch2/catch.hpp>
#include <cmath>
#include <mutex>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "autograd/ops/nn.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/gpt2/attention.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/tensor/dropout_streams.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;

constexpr int64_t kB = 2, kT = 6, kC = 8, kH = 2, kD = kC / kH;

GptConfig attention_config(double attention_dropout) {
  GptConfig c;
  c.vocab_size = 37;
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = kH;
  c.n_embd = kC;
  c.attention_dropout = attention_dropout;
  return c;
}

TEST_CASE("attention dropout drops the probabilities with the sliced stream's mask",
          "[gpt][dropout]") {
  constexpr double kP = 0.3;
  parallel::DropoutStreams streams(11, "dropout", 0);
  const std::unique_ptr<parallel::Communicator> one = std::move(parallel::make_thread_group(1)[0]);
  CausalSelfAttention attn(attention_config(kP), streams, *one);
  Generator init(3);
  for (const NamedParameter& p : attn.named_parameters()) {
    p.tensor.detach().copy_(randn(p.tensor.shape(), init, {}, 0.0, 0.5));
  }
  const Tensor x = randn({kB, kT, kC}, init);
  // The mask the forward will draw: the same stream at the same offset, over (B, H, T, T).
  Generator probe = streams.sliced();
  const std::vector<double> keep = dropout(ones({kB, kH, kT, kT}), kP, probe).to_vector<double>();
  attn.train();
  const std::vector<double> got = attn.forward(x).to_vector<double>();
  CHECK(streams.sliced().offset() == probe.offset());
  CHECK(streams.replicated().offset() == 0);  // the output's rate is 0: nothing drawn

  // Naive f64 loops: c_attn, per-head causal softmax, the mask, times v, c_proj.
  auto param = [&](const std::string& name) {
    for (const NamedParameter& p : attn.named_parameters()) {
      if (p.name == name) return p.tensor.to_vector<double>();
    }
    FAIL("no parameter " << name);
    return std::vector<double>();
  };
  const std::vector<double> wa = param("c_attn.weight"), ba = param("c_attn.bias");
  const std::vector<double> wp = param("c_proj.weight"), bp = param("c_proj.bias");
  const std::vector<double> xs = x.to_vector<double>();
  int64_t dropped = 0;
  std::vector<double> want(kB * kT * kC);
  for (int64_t b = 0; b < kB; ++b) {
    std::vector<double> qkv(kT * 3 * kC);
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t o = 0; o < 3 * kC; ++o) {
        double s = ba[o];
        for (int64_t i = 0; i < kC; ++i) s += wa[o * kC + i] * xs[(b * kT + t) * kC + i];
        qkv[t * 3 * kC + o] = s;
      }
    }
    std::vector<double> merged(kT * kC, 0.0);
    for (int64_t h = 0; h < kH; ++h) {
      for (int64_t i = 0; i < kT; ++i) {
        std::vector<double> p(i + 1);
        double max = -INFINITY, sum = 0;
        for (int64_t s = 0; s <= i; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < kD; ++d) {
            dot += qkv[i * 3 * kC + h * kD + d] * qkv[s * 3 * kC + kC + h * kD + d];
          }
          p[s] = dot / std::sqrt(static_cast<double>(kD));
          max = std::max(max, p[s]);
        }
        for (double& e : p) sum += (e = std::exp(e - max));
        for (int64_t s = 0; s <= i; ++s) {
          const double m = keep[((b * kH + h) * kT + i) * kT + s];
          dropped += m == 0.0;
          for (int64_t d = 0; d < kD; ++d) {
            merged[i * kC + h * kD + d] += p[s] / sum * m * qkv[s * 3 * kC + 2 * kC + h * kD + d];
          }
        }
      }
    }
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t o = 0; o < kC; ++o) {
        double s = bp[o];
        for (int64_t i = 0; i < kC; ++i) s += wp[o * kC + i] * merged[t * kC + i];
        want[(b * kT + t) * kC + o] = s;
      }
    }
  }
  CHECK(dropped > 0);  // the causal triangle holds 42 probabilities; ~30% are dropped
  CHECK(dropped < kB * kH * kT * (kT + 1) / 2);
  CHECK(testing::relative_l2_error(got, want) <= 1e-5);
}

TEST_CASE("fused attention dropout has the unfused ops' values and gradients", "[gpt][dropout]") {
  // causal_attention(q, k, v, p, gen) against matmul(dropout(softmax(masked scores), p, gen),
  // v) from a copy of gen: the same draw, the same mask (Note [Attention-probability
  // dropout] in kernels/attention.h), across the CPU kernel's 64-position blocks.
  constexpr double kP = 0.25;
  const int64_t b = 2, h = 3, t = 70, d = 8;
  Generator init(4);
  std::vector<Tensor> leaves;
  for (int i = 0; i < 3; ++i) {
    leaves.push_back(randn({b, h, t, d}, init, {DType::f64}));
    leaves.back().set_requires_grad(true);
  }
  const Tensor dout = randn({b, h, t, d}, init, {DType::f64});
  std::vector<bool> causal(static_cast<size_t>(t * t));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < t; ++j) causal[static_cast<size_t>(i * t + j)] = j <= i;
  }
  const Tensor visible = from_vector(causal, {t, t});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Generator fused_gen(77, 3), unfused_gen(77, 3);
  const auto run = [&](bool fused) {
    for (const Tensor& leaf : leaves) leaf.set_grad(Tensor());
    const Tensor &q = leaves[0], &k = leaves[1], &v = leaves[2];
    Tensor out;
    if (fused) {
      out = causal_attention(q, k, v, kP, fused_gen);
    } else {
      const Tensor scores = matmul(q, transpose(k, 2, 3)) * scale;
      const Tensor masked = where(visible, scores, scalar_like(scores, -INFINITY));
      out = matmul(dropout(softmax(masked), kP, unfused_gen), v);
    }
    backward(sum(out * dout));
    std::vector<std::vector<double>> got{out.to_vector<double>()};
    for (const Tensor& leaf : leaves) got.push_back(leaf.grad().to_vector<double>());
    return got;
  };
  const std::vector<std::vector<double>> fused = run(true), unfused = run(false);
  CHECK(fused_gen.offset() == unfused_gen.offset());
  for (size_t i = 0; i < fused.size(); ++i) {
    INFO("output, dq, dk, dv: " << i);
    CHECK(testing::max_abs_diff(fused[i], unfused[i]) <= 1e-12);
  }
  // Not the undropped attention's.
  Generator none(77, 3);
  const std::vector<double> plain =
      causal_attention(leaves[0], leaves[1], leaves[2], 0.0, none).to_vector<double>();
  CHECK(testing::max_abs_diff(plain, fused[0]) > 1e-2);
}

TEST_CASE("evaluation drops no attention probabilities, whatever the rate", "[gpt][dropout]") {
  Gpt with(attention_config(0.5), 7), without(attention_config(0.0), 7);
  with.eval();
  without.eval();
  std::vector<int64_t> ids(kB * kT);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 37);
  const Tensor idx = from_vector(ids, {kB, kT});
  NoGradGuard no_grad;
  CHECK(with.forward(idx).to_vector<float>() == without.forward(idx).to_vector<float>());
}

TEST_CASE("the attention dropout rate follows dropout unless given, and 0 with sparsity",
          "[gpt][dropout][config]") {
  GptConfig c = attention_config(0.0);
  c.attention_dropout.reset();
  c.dropout = 0.2;
  CHECK(c.attention_probs_dropout() == 0.2);
  c.attention_dropout = 0.05;
  CHECK(c.attention_probs_dropout() == 0.05);
  c.attention_dropout.reset();
  c.sparse_attention = SparsityConfig{};
  c.sparse_attention->unidirectional = true;
  CHECK(c.attention_probs_dropout() == 0.0);
  c.validate();
  c.attention_dropout = 0.1;
  CHECK_THAT(error_of([&] { c.validate("[config] $.model."); }),
             Catch::Contains("[config] $.model.attention_dropout: block-sparse attention drops "
                             "none of its probabilities") &&
                 Catch::Contains("expected 0 with sparse_attention, found 0.1"));
  c.sparse_attention.reset();
  c.attention_dropout = 1.0;
  CHECK_THAT(error_of([&] { c.validate(); }),
             Catch::Contains("attention_dropout: expected a number in [0, 1), found 1"));
}

TEST_CASE("dropout streams: replicated alike on every rank, sliced per rank, keyed per step",
          "[dropout][tensor_parallel]") {
  parallel::DropoutStreams r0(5, "dropout", 0), r1(5, "dropout", 1), other(5, "dropout x", 0);
  CHECK(r0.replicated().seed() == r1.replicated().seed());
  CHECK(r0.sliced().seed() != r1.sliced().seed());
  CHECK(r0.sliced().seed() != r0.replicated().seed());
  CHECK(other.replicated().seed() != r0.replicated().seed());
  // The engine's per-step key (Note [Dropout per step]): hash(own key, "step s"), offset 0.
  const uint64_t own = Generator::for_name(5, "dropout").seed();
  r0.replicated().reserve(100);
  r0.key_for_step(3);
  CHECK(r0.replicated().seed() == hash_name(own, "step 3"));
  CHECK(r0.replicated().offset() == 0);
  const uint64_t sliced3 = r0.sliced().seed();
  r0.key_for_step(4);
  CHECK(r0.sliced().seed() != sliced3);
  r0.key_for_step(3);
  CHECK(r0.sliced().seed() == sliced3);
  r1.key_for_step(3);
  CHECK(r1.replicated().seed() == r0.replicated().seed());
  CHECK(r1.sliced().seed() != r0.sliced().seed());
  CHECK(r0.generators() == std::vector<Generator*>{&r0.replicated(), &r0.sliced()});
}

TEST_CASE("tensor-parallel ranks draw attention masks of their own and the rest alike",
          "[gpt][dropout][tensor_parallel]") {
  GptConfig c = attention_config(0.1);
  c.dropout = 0.1;
  c.n_head = 4;
  struct Drawn {
    uint64_t replicated_seed, replicated_offset, sliced_seed, sliced_offset;
  };
  std::vector<Drawn> drawn(2);
  std::mutex mutex;
  parallel::run_thread_ranks(2, [&](parallel::Communicator& group) {
    Gpt model(c, 7, &group);
    model.train();
    model.dropout_streams().key_for_step(0);
    std::vector<int64_t> ids(kB * kT);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 37);
    model.forward(from_vector(ids, {kB, kT}));
    parallel::DropoutStreams& s = model.dropout_streams();
    std::lock_guard<std::mutex> lock(mutex);
    drawn[group.rank()] = {s.replicated().seed(), s.replicated().offset(), s.sliced().seed(),
                           s.sliced().offset()};
  });
  CHECK(drawn[0].replicated_seed == drawn[1].replicated_seed);
  CHECK(drawn[0].replicated_offset == drawn[1].replicated_offset);
  CHECK(drawn[0].replicated_offset > 0);  // embeddings, attention outputs, MLP outputs
  CHECK(drawn[0].sliced_seed != drawn[1].sliced_seed);
  CHECK(drawn[0].sliced_offset == drawn[1].sliced_offset);
  // Each rank's two heads' (B, 2, T, T) probabilities in each of the 2 blocks.
  CHECK(drawn[0].sliced_offset == 2 * ((kB * 2 * kT * kT + 3) / 4));
}

TEST_CASE("recomputed blocks drop the attention probabilities they dropped before",
          "[gpt][dropout][checkpoint]") {
  GptConfig c = attention_config(0.2);
  c.dropout = 0.1;
  auto grads = [&](int64_t interval) {
    Gpt model(c, 7);
    model.train();
    model.set_activation_checkpointing(interval);
    std::vector<int64_t> ids(kB * kT);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 5 % 37);
    const Tensor idx = from_vector(ids, {kB, kT});
    backward(model.loss(model.forward(idx), idx));
    std::vector<std::vector<float>> g;
    for (const NamedParameter& p : model.named_parameters()) {
      g.push_back(p.tensor.grad().to_vector<float>());
    }
    return g;
  };
  CHECK(grads(1) == grads(0));
}

}  // namespace
}  // namespace tessera
