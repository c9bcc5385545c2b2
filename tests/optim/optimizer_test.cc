// SGD, Adam/AdamW and LAMB against naive f64 loops of their published update rules.
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/lamb.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace tessera::optim {
namespace {

using testing::error_of;
using testing::require_close;

using Vec = std::vector<double>;

// A named f64 parameter holding `values`, with the gradient `grad`.
NamedParameter param(const std::string& name, const Vec& values) {
  Tensor t = from_vector(values);
  t.set_requires_grad(true);
  return {name, t, {}};
}

void set_grad(const NamedParameter& p, const Vec& g) { p.tensor.set_grad(from_vector(g)); }

const Vec kW = {0.5, -1.25, 2.0, 0.0, -0.3};
const std::vector<Vec> kGrads = {
    {0.1, -0.2, 0.3, 0.05, -0.4}, {-0.3, 0.1, 0.2, -0.1, 0.25}, {0.2, 0.2, -0.1, 0.3, 0.0}};

// Three steps of `opt` on a parameter starting at kW with gradients kGrads.
Vec run(Optimizer& opt, const NamedParameter& p) {
  for (const Vec& g : kGrads) {
    set_grad(p, g);
    opt.step();
  }
  return p.tensor.to_vector<double>();
}

Vec adam_reference(double lr, double b1, double b2, double eps, double wd, bool adamw) {
  Vec w = kW, m(5, 0.0), v(5, 0.0);
  for (size_t t = 1; t <= kGrads.size(); ++t) {
    for (size_t i = 0; i < 5; ++i) {
      double g = kGrads[t - 1][i];
      if (!adamw) g += wd * w[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      w[i] -= lr * (mh / (std::sqrt(vh) + eps) + (adamw ? wd * w[i] : 0.0));
    }
  }
  return w;
}

TEST_CASE("Adam in AdamW mode and in L2 mode match the update rule") {
  for (const bool adamw : {true, false}) {
    const NamedParameter p = param("w", kW);
    AdamOptions o;
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.eps = 1e-6;
    o.adam_w_mode = adamw;
    Adam opt({{{p}, 0.01, 0.1}}, o);
    require_close(from_vector(run(opt, p)), adam_reference(0.01, 0.8, 0.95, 1e-6, 0.1, adamw),
                  1e-12);
    CHECK(opt.step_count() == 3);
  }
}

TEST_CASE("SGD with momentum, dampening and Nesterov matches torch.optim.SGD") {
  struct Case {
    double momentum, dampening;
    bool nesterov;
  };
  for (const Case c : {Case{0.0, 0.0, false}, Case{0.9, 0.1, false}, Case{0.9, 0.0, true}}) {
    const NamedParameter p = param("w", kW);
    Sgd opt({{{p}, 0.1, 0.01}}, {c.momentum, c.dampening, c.nesterov});
    Vec w = kW, buf(5, 0.0);
    for (size_t t = 0; t < kGrads.size(); ++t) {
      for (size_t i = 0; i < 5; ++i) {
        const double g = kGrads[t][i] + 0.01 * w[i];
        double d = g;
        if (c.momentum != 0) {
          buf[i] = t == 0 ? g : c.momentum * buf[i] + (1 - c.dampening) * g;
          d = c.nesterov ? g + c.momentum * buf[i] : buf[i];
        }
        w[i] -= 0.1 * d;
      }
    }
    require_close(from_vector(run(opt, p)), w, 1e-12);
  }
}

TEST_CASE("LAMB scales Adam's update by the clamped trust ratio") {
  for (const double max_coeff : {10.0, 0.5}) {
    const NamedParameter p = param("w", kW);
    LambOptions o;
    o.max_coeff = max_coeff;
    Lamb opt({{{p}, 0.01, 0.05}}, o);
    Vec w = kW, m(5, 0.0), v(5, 0.0);
    double last = 0;
    for (size_t t = 1; t <= kGrads.size(); ++t) {
      Vec u(5);
      double pn = 0, un = 0;
      for (size_t i = 0; i < 5; ++i) {
        const double g = kGrads[t - 1][i];
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.999 * v[i] + 0.001 * g * g;
        u[i] =
            (m[i] / (1 - std::pow(0.9, t))) / (std::sqrt(v[i] / (1 - std::pow(0.999, t))) + 1e-8) +
            0.05 * w[i];
        pn += w[i] * w[i];
        un += u[i] * u[i];
      }
      last = std::clamp(std::sqrt(pn) / std::sqrt(un), 0.01, max_coeff);
      for (size_t i = 0; i < 5; ++i) w[i] -= 0.01 * last * u[i];
    }
    require_close(from_vector(run(opt, p)), w, 1e-12);
    REQUIRE(opt.lamb_coeffs().size() == 1);
    CHECK(opt.lamb_coeffs()[0] == Approx(last).epsilon(1e-12));
  }
}

TEST_CASE("clip_grad_norm returns the global norm and scales like DeepSpeed") {
  const NamedParameter a = param("a", {3.0, 0.0});
  const NamedParameter b = param("b", {0.0, 0.0, 4.0});
  const NamedParameter c = param("c", {1.0});  // no gradient: counts as zero
  set_grad(a, {3.0, 0.0});
  set_grad(b, {0.0, 0.0, 4.0});
  CHECK(clip_grad_norm({a.tensor, b.tensor, c.tensor}, 0.0) == Approx(5.0));  // no clipping
  CHECK(a.tensor.grad().to_vector<double>() == Vec{3.0, 0.0});
  CHECK(clip_grad_norm({a.tensor, b.tensor, c.tensor}, 1.0) == Approx(5.0));
  const double coef = 1.0 / (5.0 + 1e-6);
  require_close(a.tensor.grad(), {3.0 * coef, 0.0}, 1e-14);
  require_close(b.tensor.grad(), {0.0, 0.0, 4.0 * coef}, 1e-14);
  CHECK(clip_grad_norm({a.tensor, b.tensor}, 10.0) == Approx(1.0).epsilon(1e-6));  // below max
}

TEST_CASE("decay_groups leaves 1-D and named parameters undecayed") {
  const std::vector<NamedParameter> params = {
      {"h.0.w", zeros({2, 2}), {}}, {"h.0.b", zeros({2}), {}}, {"wte", zeros({3, 2}), {}}};
  const std::vector<ParamGroup> g = decay_groups(params, 0.1, 0.01, true, {"wte"});
  REQUIRE(g.size() == 2);
  CHECK(g[0].weight_decay == 0.01);
  REQUIRE(g[0].params.size() == 1);
  CHECK(g[0].params[0].name == "h.0.w");
  CHECK(g[1].weight_decay == 0.0);
  CHECK(g[1].params.size() == 2);
  CHECK(decay_groups(params, 0.1, 0.01, false, {}).size() == 1);
}

TEST_CASE("optimizer state round-trips and the restored run continues identically") {
  const NamedParameter p = param("w", kW);
  Adam a({{{p}, 0.01, 0.1}}, {});
  set_grad(p, kGrads[0]);
  a.step();
  const NamedParameter q = param("w", p.tensor.to_vector<double>());
  Adam b({{{q}, 0.01, 0.1}}, {});
  StateDict saved;
  for (const auto& [k, t] : a.state_dict()) saved.emplace_back(k, t.clone());
  b.load_state_dict(saved);
  CHECK(b.step_count() == 1);
  for (Optimizer* o : {static_cast<Optimizer*>(&a), static_cast<Optimizer*>(&b)}) {
    const NamedParameter& x = o == &a ? p : q;
    set_grad(x, kGrads[1]);
    o->step();
  }
  CHECK(p.tensor.to_vector<double>() == q.tensor.to_vector<double>());

  StateDict bad = saved;
  bad[1].first = "exp_avg.nope";
  CHECK_THAT(error_of([&] { b.load_state_dict(bad); }),
             Catch::Contains("\"exp_avg.nope\" names no parameter"));
  bad = saved;
  bad[1].second = zeros({4}, {DType::f64});
  CHECK_THAT(error_of([&] { b.load_state_dict(bad); }),
             Catch::Contains("expected f64 (5), found f64 (4)"));
  CHECK(b.step_count() == 2);  // failed loads changed nothing
}

TEST_CASE("an optimizer refuses a parameter listed twice") {
  const NamedParameter p = param("w", kW);
  CHECK_THAT(error_of([&] {
               Adam({{{p}, 0.1, 0.0}, {{p}, 0.1, 0.0}}, {});
             }),
             Catch::Contains("parameter \"w\" appears in more than one place"));
}

}  // namespace
}  // namespace tessera::optim
