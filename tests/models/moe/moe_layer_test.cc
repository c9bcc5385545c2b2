// The MoE layer (models/moe/moe_layer.h) against a naive f64 loop over tokens, written from
// DeepSpeed's MOELayer (deepspeed/moe/sharded_moe.py): its output and l_aux, and its
// gradients against central finite differences of that loop.
#include "models/moe/moe_layer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/moe/expert_mlp.h"

namespace tessera::moe {
namespace {

constexpr int64_t kEmbd = 6, kHidden = 10, kExperts = 4;

using Values = std::map<std::string, std::vector<double>>;  // parameter name -> values

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// y = W x + b for W (out, in) row-major.
std::vector<double> affine(const std::vector<double>& W, const std::vector<double>* b,
                           const double* x, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double acc = b ? (*b)[static_cast<size_t>(o)] : 0.0;
    for (int64_t i = 0; i < in; ++i) acc += W[static_cast<size_t>(o * in + i)] * x[i];
    y[static_cast<size_t>(o)] = acc;
  }
  return y;
}

std::vector<double> expert(const Values& p, const std::string& prefix, const double* x) {
  std::vector<double> h =
      affine(p.at(prefix + "c_fc.weight"), &p.at(prefix + "c_fc.bias"), x, kEmbd, kHidden);
  for (double& v : h) v = gelu(v);
  return affine(p.at(prefix + "c_proj.weight"), &p.at(prefix + "c_proj.bias"), h.data(), kHidden,
                kEmbd);
}

struct Naive {
  std::vector<double> out;  // (S, C)
  double l_aux = 0;
  int64_t dropped = 0;
};

// The layer on S tokens, one at a time, in f64: top-k experts by probability, capacity
// slots taken in token order (second choices after all first choices), kept choices
// weighted p (top-1) or p / (p1 + p2) over the kept ones (top-2).
Naive naive_moe(const Values& p, const std::vector<double>& x, int64_t S, int k, int64_t C,
                bool residual) {
  const int64_t E = kExperts;
  std::vector<std::vector<double>> probs(static_cast<size_t>(S));
  std::vector<std::vector<int64_t>> choice(static_cast<size_t>(S));
  std::vector<double> me(static_cast<size_t>(E), 0.0), ce(static_cast<size_t>(E), 0.0);
  for (int64_t s = 0; s < S; ++s) {
    std::vector<double> l =
        affine(p.at("gate.weight"), nullptr, &x[static_cast<size_t>(s * kEmbd)], kEmbd, E);
    double top = l[0], total = 0;
    for (double v : l) top = std::max(top, v);
    std::vector<double>& pr = probs[static_cast<size_t>(s)];
    for (double v : l) pr.push_back(std::exp(v - top)), total += pr.back();
    for (double& v : pr) v /= total;
    int64_t e1 = 0;
    for (int64_t e = 1; e < E; ++e)
      e1 = pr[static_cast<size_t>(e)] > pr[static_cast<size_t>(e1)] ? e : e1;
    choice[static_cast<size_t>(s)].push_back(e1);
    if (k == 2) {
      int64_t e2 = e1 == 0 ? 1 : 0;
      for (int64_t e = 0; e < E; ++e) {
        if (e != e1 && l[static_cast<size_t>(e)] > l[static_cast<size_t>(e2)]) e2 = e;
      }
      choice[static_cast<size_t>(s)].push_back(e2);
    }
    for (int64_t e = 0; e < E; ++e) me[static_cast<size_t>(e)] += pr[static_cast<size_t>(e)] / S;
    ce[static_cast<size_t>(e1)] += 1.0 / S;
  }
  Naive n;
  for (int64_t e = 0; e < E; ++e)
    n.l_aux += E * me[static_cast<size_t>(e)] * ce[static_cast<size_t>(e)];
  std::vector<int64_t> used(static_cast<size_t>(E), 0);
  std::vector<std::vector<bool>> kept(static_cast<size_t>(S), std::vector<bool>(2, false));
  for (int j = 0; j < k; ++j) {
    for (int64_t s = 0; s < S; ++s) {
      kept[static_cast<size_t>(s)][static_cast<size_t>(j)] =
          used[static_cast<size_t>(choice[static_cast<size_t>(s)][static_cast<size_t>(j)])]++ < C;
      n.dropped += !kept[static_cast<size_t>(s)][static_cast<size_t>(j)];
    }
  }
  n.out.assign(static_cast<size_t>(S * kEmbd), 0.0);
  for (int64_t s = 0; s < S; ++s) {
    const double* xs = &x[static_cast<size_t>(s * kEmbd)];
    double denom = 0;
    for (int j = 0; j < k; ++j) {
      if (kept[static_cast<size_t>(s)][static_cast<size_t>(j)])
        denom += probs[static_cast<size_t>(s)]
                      [static_cast<size_t>(choice[static_cast<size_t>(s)][static_cast<size_t>(j)])];
    }
    std::vector<double> y(static_cast<size_t>(kEmbd), 0.0);
    for (int j = 0; j < k; ++j) {
      if (!kept[static_cast<size_t>(s)][static_cast<size_t>(j)]) continue;
      const int64_t e = choice[static_cast<size_t>(s)][static_cast<size_t>(j)];
      const double pe = probs[static_cast<size_t>(s)][static_cast<size_t>(e)];
      const double w = k == 1 ? pe : pe / denom;
      const std::vector<double> ye = expert(p, "experts." + std::to_string(e) + ".", xs);
      for (int64_t c = 0; c < kEmbd; ++c)
        y[static_cast<size_t>(c)] += w * ye[static_cast<size_t>(c)];
    }
    if (residual) {
      const std::vector<double> dense = expert(p, "mlp.", xs);
      std::vector<double> a =
          affine(p.at("coefficient.weight"), &p.at("coefficient.bias"), xs, kEmbd, 2);
      const double m = std::max(a[0], a[1]);
      const double c0 = std::exp(a[0] - m) / (std::exp(a[0] - m) + std::exp(a[1] - m));
      for (int64_t c = 0; c < kEmbd; ++c) {
        y[static_cast<size_t>(c)] =
            y[static_cast<size_t>(c)] * c0 + dense[static_cast<size_t>(c)] * (1.0 - c0);
      }
    }
    for (int64_t c = 0; c < kEmbd; ++c)
      n.out[static_cast<size_t>(s * kEmbd + c)] = y[static_cast<size_t>(c)];
  }
  return n;
}

struct Case {
  int k;
  double capacity_factor;
  bool residual;
};

// The loss both sides differentiate: sum(out * R) + 0.1 * l_aux.
double naive_loss(const Values& p, const std::vector<double>& x, const std::vector<double>& R,
                  int64_t S, int k, int64_t C, bool residual) {
  const Naive n = naive_moe(p, x, S, k, C, residual);
  double L = 0.1 * n.l_aux;
  for (size_t i = 0; i < R.size(); ++i) L += n.out[i] * R[i];
  return L;
}

TEST_CASE("the MoE layer equals a per-token loop, forward and gradients", "[moe]") {
  const int64_t B = 3, T = 5, S = B * T;
  for (const Case c : {Case{1, 4.0, false}, Case{1, 0.5, false}, Case{2, 4.0, false},
                       Case{2, 0.5, false}, Case{1, 0.5, true}, Case{2, 0.75, true}}) {
    DYNAMIC_SECTION("top-" << c.k << ", capacity_factor " << c.capacity_factor
                           << (c.residual ? ", residual" : "")) {
      Generator gen(17);
      GateConfig gate;
      gate.k = c.k;
      gate.capacity_factor = c.capacity_factor;
      gate.min_capacity = 0;
      gate.use_rts = false;
      gate.top2_2nd_expert_sampling = false;
      MoeLayer layer(
          kEmbd, kExperts, gate, c.residual,
          [](int64_t) { return std::make_unique<ExpertMlp>(kEmbd, kHidden, true); }, gen);
      Values p;
      Generator init(3);
      for (const NamedParameter& np : layer.named_parameters()) {
        NoGradGuard no_grad;
        np.tensor.copy_(randn(np.tensor.shape(), init, {}, 0.0, 0.5));
        p[np.name] = np.tensor.to_vector<double>();
      }
      Tensor x = randn({B, T, kEmbd}, init);
      x.set_requires_grad(true);
      const Tensor R = randn({B, T, kEmbd}, init);
      const std::vector<double> xv = x.to_vector<double>(), Rv = R.to_vector<double>();

      const MoeOutput out = layer.forward(x);
      const int64_t C = out.routing.capacity;
      CHECK(C == expert_capacity(S, kExperts, c.capacity_factor * c.k, 0));
      const Naive want = naive_moe(p, xv, S, c.k, C, c.residual);
      CHECK(out.routing.dropped == want.dropped);
      if (c.capacity_factor < 1) CHECK(want.dropped > 0);
      const std::vector<double> got = out.output.to_vector<double>();
      REQUIRE(got.size() == want.out.size());
      for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want.out[i]).margin(1e-5));
      CHECK(out.l_aux.item<double>() == Approx(want.l_aux).epsilon(1e-5));

      backward(add(sum(mul(out.output, R)), mul(out.l_aux, scalar_like(out.l_aux, 0.1))));
      // Central differences of the f64 loop (steps far smaller than any routing margin).
      const double h = 1e-6;
      auto check_grad = [&](const std::string& what, const Tensor& grad,
                            const std::function<double&(Values&, std::vector<double>&, size_t)>& at,
                            size_t n) {
        REQUIRE(grad.defined());
        const std::vector<double> g = grad.to_vector<double>();
        for (size_t i = 0; i < n; ++i) {
          Values pp = p;
          std::vector<double> xx = xv;
          double& v = at(pp, xx, i);
          const double v0 = v;
          v = v0 + h;
          const double up = naive_loss(pp, xx, Rv, S, c.k, C, c.residual);
          v = v0 - h;
          const double down = naive_loss(pp, xx, Rv, S, c.k, C, c.residual);
          INFO(what << "[" << i << "]");
          CHECK(g[i] == Approx((up - down) / (2 * h)).margin(2e-4).epsilon(2e-3));
        }
      };
      check_grad(
          "x", x.grad(),
          [](Values&, std::vector<double>& xx, size_t i) -> double& { return xx[i]; }, xv.size());
      for (const NamedParameter& np : layer.named_parameters()) {
        const std::string name = np.name;
        check_grad(
            name, np.tensor.grad(),
            [&](Values& pp, std::vector<double>&, size_t i) -> double& { return pp.at(name)[i]; },
            p.at(name).size());
      }
    }
  }
}

TEST_CASE("the MoE layer runs 16-bit experts with an f32 gate", "[moe]") {
  Generator gen(5);
  GateConfig gate;
  gate.k = 2;
  gate.min_capacity = 0;
  MoeLayer layer(
      kEmbd, kExperts, gate, false,
      [](int64_t) { return std::make_unique<ExpertMlp>(kEmbd, kHidden, true, DType::bf16); }, gen,
      DType::bf16);
  for (const NamedParameter& np : layer.named_parameters()) {
    NoGradGuard no_grad;
    Generator init(1);
    np.tensor.copy_(randn(np.tensor.shape(), init, {}, 0.0, 0.5));
    CHECK(np.tensor.dtype() == (np.name == "gate.weight" ? DType::f32 : DType::bf16));
  }
  const Tensor x = randn({2, 4, kEmbd}, gen, {DType::bf16});
  const MoeOutput out = layer.forward(x);
  CHECK(out.output.dtype() == DType::bf16);
  CHECK(out.l_aux.dtype() == DType::f32);
  CHECK(out.output.shape() == x.shape());

  // A mixed-precision run makes every parameter 16-bit; the gate's product stays f32: its
  // load-balancing loss is the f32 one of the bf16 weights, not a bf16 product's.
  layer.to(Device::cpu(), DType::bf16);
  const std::vector<double> w = layer.named_parameters().front().tensor.to_vector<double>();
  const std::vector<double> xs = x.to_vector<double>();
  std::vector<double> me(kExperts, 0.0), ce(kExperts, 0.0);
  for (int64_t s = 0; s < 8; ++s) {
    std::vector<double> p(kExperts);
    double total = 0;
    for (int64_t e = 0; e < kExperts; ++e) {
      double l = 0;
      for (int64_t c = 0; c < kEmbd; ++c)
        l += w[static_cast<size_t>(e * kEmbd + c)] * xs[static_cast<size_t>(s * kEmbd + c)];
      total += p[static_cast<size_t>(e)] = std::exp(l);
    }
    int64_t first = 0;
    for (int64_t e = 0; e < kExperts; ++e) {
      p[static_cast<size_t>(e)] /= total;
      me[static_cast<size_t>(e)] += p[static_cast<size_t>(e)] / 8;
      if (p[static_cast<size_t>(e)] > p[static_cast<size_t>(first)]) first = e;
    }
    ce[static_cast<size_t>(first)] += 1.0 / 8;
  }
  double l_aux = 0;
  for (int64_t e = 0; e < kExperts; ++e)
    l_aux += kExperts * me[static_cast<size_t>(e)] * ce[static_cast<size_t>(e)];
  CHECK(layer.named_parameters().front().tensor.dtype() == DType::bf16);
  CHECK(layer.forward(x).l_aux.item<double>() == Approx(l_aux).epsilon(1e-5));
}

TEST_CASE("noisy gating draws from the layer's generator only while training", "[moe]") {
  for (NoisyGatePolicy policy : {NoisyGatePolicy::jitter, NoisyGatePolicy::rsample}) {
    Generator gen(9);
    GateConfig gate;
    gate.noisy_gate_policy = policy;
    gate.use_rts = false;
    gate.min_capacity = 0;
    MoeLayer layer(
        kEmbd, kExperts, gate, false,
        [](int64_t) { return std::make_unique<ExpertMlp>(kEmbd, kHidden, true); }, gen);
    Generator init(2);
    for (const NamedParameter& np : layer.named_parameters()) {
      NoGradGuard no_grad;
      np.tensor.copy_(randn(np.tensor.shape(), init));
    }
    const Tensor x = randn({4, 8, kEmbd}, init);
    NoGradGuard no_grad;
    const uint64_t before = gen.offset();
    layer.train(false);
    layer.forward(x);
    CHECK(gen.offset() == before);
    layer.train(true);
    layer.forward(x);
    CHECK(gen.offset() > before);
  }
}

TEST_CASE("the MoE layer refuses inputs of the wrong width", "[moe]") {
  Generator gen(1);
  MoeLayer layer(
      kEmbd, kExperts, GateConfig{}, false,
      [](int64_t) { return std::make_unique<ExpertMlp>(kEmbd, kHidden, true); }, gen);
  CHECK_THROWS_WITH(layer.forward(zeros({4, kEmbd + 1})),
                    Catch::Contains("expected an input of (..., 6)"));
}

}  // namespace
}  // namespace tessera::moe
