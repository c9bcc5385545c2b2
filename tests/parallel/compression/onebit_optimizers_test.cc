// The 1-bit optimizers (parallel/compression/onebit_optimizer.h) against independent
// references: with compression never reached, the uncompressed optimizers (Adam and LAMB
// without bias correction) at two ranks; at one rank, where the 1-bit all-reduce is the
// identity, plain f64 loops of DeepSpeed's update rules through every stage (frozen
// variance, 0/1 Adam's local steps with its momentum accumulator, 1-bit LAMB's scaling
// coefficients and factor); at several ranks, bitwise agreement where the method
// promises it. Per-rank state: onebit_state_test.cc.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mutex>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "optim/adam.h"
#include "optim/lamb.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/compression/onebit_adam.h"
#include "parallel/compression/onebit_lamb.h"
#include "parallel/compression/zero_one_adam.h"
#include "tests/parallel/compression/onebit_setup.h"

namespace tessera::parallel {
namespace {

using namespace onebit_testing;

TEST_CASE(
    "with compression never reached, each 1-bit optimizer is its uncompressed "
    "counterpart",
    "[onebit]") {
  constexpr int kWorld = 2;
  constexpr int64_t kSteps = 12;
  for (const Kind kind : {Kind::adam, Kind::zero_one, Kind::lamb}) {
    INFO("optimizer " << static_cast<int>(kind));
    std::vector<int64_t> calls;
    const Trace got = run_ranks(kind, kWorld, onebit_options(), kSteps, &calls);
    CHECK(calls == std::vector<int64_t>{0});  // nothing was compressed
    // The reference: Adam or LAMB without bias correction on the averaged gradients of
    // steps 2..kSteps (step 1 is the initialization step).
    std::vector<optim::ParamGroup> groups = make_groups();
    const std::vector<Tensor> params = params_of(groups);
    std::unique_ptr<optim::Optimizer> ref;
    if (kind == Kind::lamb) {
      ref = std::make_unique<optim::Lamb>(std::move(groups), lamb_options());
    } else {
      ref = std::make_unique<optim::Adam>(std::move(groups), adam_options());
    }
    std::vector<Vec> initial;
    for (const Tensor& p : params) initial.push_back(values(p));
    CHECK(max_diff(got[0][0], initial) == 0.0);  // the initialization step changes nothing
    for (int64_t t = 2; t <= kSteps; ++t) {
      set_grads(params, 0, kWorld, true, t);
      ref->step();
      std::vector<Vec> want;
      for (const Tensor& p : params) want.push_back(values(p));
      INFO("step " << t);
      CHECK(max_diff(got[0][t - 1], want) <= 1e-6);
      CHECK(max_diff(got[1][t - 1], got[0][t - 1]) == 0.0);
    }
  }
}

// DeepSpeed's update rules at one rank, in f64 (the 1-bit all-reduce is the identity).
struct Reference {
  std::vector<Vec> p, m, v, v_fresh, u;
  std::vector<double> lrs = {0, 0}, lamb_coeff_freeze, last_factor, scaling;

  Reference() {
    for (size_t i = 0; i < kShapes.size(); ++i) {
      const int64_t n = numel_of(kShapes[i]);
      Vec init(n);
      for (int64_t k = 0; k < n; ++k) init[k] = static_cast<float>(initial_value(i, k));
      p.push_back(init);
      m.push_back(Vec(n, 0.0));
      v.push_back(Vec(n, 0.0));
      v_fresh.push_back(Vec(n, 0.0));
      u.push_back(Vec(n, 0.0));
    }
    lamb_coeff_freeze.assign(kShapes.size(), 0.0);
    last_factor.assign(kShapes.size(), 1.0);
  }

  static double norm(const Vec& x) {
    double s = 0;
    for (double e : x) s += e * e;
    return std::sqrt(s);
  }

  // Adam's moments and update; `variance` false keeps v.
  void adam(size_t i, const Vec& g, bool variance, const optim::AdamOptions& a) {
    const int gi = group_of(i);
    for (size_t k = 0; k < g.size(); ++k) {
      m[i][k] = a.beta1 * m[i][k] + (1 - a.beta1) * g[k];
      if (variance) v[i][k] = a.beta2 * v[i][k] + (1 - a.beta2) * g[k] * g[k];
      p[i][k] -= kLr[gi] * (m[i][k] / (std::sqrt(v[i][k]) + a.eps) + kWd[gi] * p[i][k]);
    }
  }

  // 0/1 Adam's local step, with DeepSpeed's accumulator u and its sync.
  void zero_one_local(size_t i, const Vec& g, bool sync, const optim::AdamOptions& a) {
    const int gi = group_of(i);
    for (size_t k = 0; k < g.size(); ++k) {
      m[i][k] = a.beta1 * m[i][k] + (1 - a.beta1) * g[k];
      const double delta = kLr[gi] * (m[i][k] / (std::sqrt(v[i][k]) + a.eps) + kWd[gi] * p[i][k]);
      p[i][k] -= delta;
      u[i][k] -= delta;
    }
    if (!sync) return;
    const double lrs_now = lrs[gi] + kLr[gi];
    for (size_t k = 0; k < g.size(); ++k) {
      const double denom = std::sqrt(v[i][k]) + a.eps;
      p[i][k] -= u[i][k];
      u[i][k] *= denom;
      m[i][k] = -u[i][k] / lrs_now;
      p[i][k] += u[i][k] / denom;
      u[i][k] = 0;
    }
  }

  void lamb_warmup(size_t i, const Vec& g, int64_t t, int64_t freeze, const optim::LambOptions& l,
                   double coeff_beta) {
    const int gi = group_of(i);
    Vec upd(g.size());
    for (size_t k = 0; k < g.size(); ++k) {
      m[i][k] = l.beta1 * m[i][k] + (1 - l.beta1) * g[k];
      v[i][k] = l.beta2 * v[i][k] + (1 - l.beta2) * g[k] * g[k];
      upd[k] = m[i][k] / (std::sqrt(v[i][k]) + l.eps) + kWd[gi] * p[i][k];
    }
    if (t == freeze) v_fresh[i] = v[i];
    const double pn = norm(p[i]), un = norm(upd);
    double c = pn != 0 && un != 0 ? pn / un : 1.0;
    c = std::clamp(c, l.min_coeff, l.max_coeff);
    if (c != 1.0) lamb_coeff_freeze[i] = coeff_beta * lamb_coeff_freeze[i] + (1 - coeff_beta) * c;
    for (size_t k = 0; k < g.size(); ++k) p[i][k] -= kLr[gi] * c * upd[k];
  }

  void lamb_compressed(const std::vector<Vec>& grads, const optim::LambOptions& l,
                       const OneBitOptions& o) {
    if (scaling.empty()) {
      Vec rms;
      for (size_t i = 0; i < m.size(); ++i) rms.push_back(norm(m[i]) / std::sqrt(m[i].size()));
      double united = 0;
      for (double r : rms) united += r / rms.size();
      for (double r : rms) scaling.push_back(united / r);
    }
    for (size_t i = 0; i < m.size(); ++i) {
      const int gi = group_of(i);
      const Vec last = m[i];
      Vec upd_pre(m[i].size()), upd(m[i].size());
      double factor = 0;
      for (size_t k = 0; k < m[i].size(); ++k) {
        // Scaled, (identity all-reduce), unscaled.
        m[i][k] = (l.beta1 * m[i][k] + (1 - l.beta1) * grads[i][k]) * scaling[i] / scaling[i];
        const double ghat = (m[i][k] - l.beta1 * last[k]) / (1 - l.beta1);
        v_fresh[i][k] = l.beta2 * v_fresh[i][k] + (1 - l.beta2) * ghat * ghat;
        const double denom = std::sqrt(v[i][k]) + l.eps;
        upd_pre[k] = m[i][k] / denom;
        upd[k] = upd_pre[k] + kWd[gi] * p[i][k];
        factor = std::max(factor, denom / (std::sqrt(v_fresh[i][k]) + l.eps));
      }
      if (kWd[gi] > 0) {
        const double r = std::min(1.0, norm(upd_pre) / norm(upd));
        factor = factor * r + (1 - r);
      }
      factor = std::clamp(factor, o.factor_min, o.factor_max);
      factor = std::clamp(factor, last_factor[i] * (1 - o.factor_threshold),
                          last_factor[i] * (1 + o.factor_threshold));
      last_factor[i] = factor;
      const double c = lamb_coeff_freeze[i] * factor;
      for (size_t k = 0; k < m[i].size(); ++k) p[i][k] -= kLr[gi] * c * upd[k];
    }
  }
};

double max_rel_diff(const std::vector<Vec>& got, const std::vector<Vec>& want) {
  double d = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    for (size_t k = 0; k < got[i].size(); ++k) {
      d = std::max(d, std::abs(got[i][k] - want[i][k]) / (1e-3 + std::abs(want[i][k])));
    }
  }
  return d;
}

TEST_CASE("at one rank, each 1-bit optimizer follows DeepSpeed's rules through every stage",
          "[onebit]") {
  constexpr int64_t kSteps = 30;
  OneBitOptions o;
  o.freeze_step = 6;
  o.var_freeze_step = 12;
  o.var_update_scaler = 2;
  o.local_step_scaler = 2;
  o.local_step_clipper = 4;
  for (const Kind kind : {Kind::adam, Kind::zero_one, Kind::lamb}) {
    INFO("optimizer " << static_cast<int>(kind));
    const Trace got = run_ranks(kind, 1, o, kSteps);
    Reference ref;
    ZeroOneAdamSchedule schedule(o.var_freeze_step, o.var_update_scaler, o.local_step_scaler,
                                 o.local_step_clipper);
    for (int64_t t = 1; t <= kSteps; ++t) {
      std::vector<Vec> g;
      for (size_t i = 0; i < kShapes.size(); ++i) g.push_back(grad_vec(0, 1, false, t, i));
      const OneBitStep zo = schedule.next();
      if (t > 1) {
        if (kind == Kind::adam) {
          for (size_t i = 0; i < g.size(); ++i)
            ref.adam(i, g[i], t <= o.freeze_step, adam_options());
        } else if (kind == Kind::zero_one) {
          for (size_t i = 0; i < g.size(); ++i) {
            if (zo == OneBitStep::local || zo == OneBitStep::local_sync) {
              ref.zero_one_local(i, g[i], zo == OneBitStep::local_sync, adam_options());
            } else {
              ref.adam(i, g[i], zo == OneBitStep::full_precision, adam_options());
            }
          }
          if (zo == OneBitStep::local || zo == OneBitStep::local_sync) {
            for (int gi = 0; gi < 2; ++gi) {
              ref.lrs[gi] = zo == OneBitStep::local_sync ? 0.0 : ref.lrs[gi] + kLr[gi];
            }
          }
        } else if (t <= o.freeze_step) {
          for (size_t i = 0; i < g.size(); ++i) {
            ref.lamb_warmup(i, g[i], t, o.freeze_step, lamb_options(), o.coeff_beta);
          }
        } else {
          ref.lamb_compressed(g, lamb_options(), o);
        }
      }
      INFO("step " << t);
      CHECK(max_rel_diff(got[0][t - 1], ref.p) <= 1e-4);
    }
  }
}

TEST_CASE("at several ranks the 1-bit steps leave the ranks where the method promises",
          "[onebit]") {
  constexpr int kWorld = 3;
  constexpr int64_t kSteps = 24;
  OneBitOptions o;
  o.freeze_step = 4;
  o.var_freeze_step = 8;
  o.var_update_scaler = 2;
  o.local_step_scaler = 2;
  o.local_step_clipper = 4;
  // 1-bit Adam and 1-bit LAMB: identical momenta, so identical parameters, every step.
  for (const Kind kind : {Kind::adam, Kind::lamb}) {
    std::vector<int64_t> calls;
    const Trace got = run_ranks(kind, kWorld, o, kSteps, &calls);
    const int64_t compressed_steps = kSteps - o.freeze_step;
    // One 1-bit all-reduce (one all_to_all) per group (Adam) or in all (LAMB) and step.
    CHECK(calls[0] == compressed_steps * (kind == Kind::adam ? 2 : 1));
    for (int64_t t = 1; t <= kSteps; ++t) {
      for (int r = 1; r < kWorld; ++r) CHECK(max_diff(got[r][t - 1], got[0][t - 1]) == 0.0);
    }
    // And they moved: the compressed stage does update.
    CHECK(max_diff(got[0][kSteps - 1], got[0][o.freeze_step - 1]) > 1e-3);
  }
  // 0/1 Adam: equal after every step but local ones, which differ (local gradients).
  const Trace got = run_ranks(Kind::zero_one, kWorld, o, kSteps);
  ZeroOneAdamSchedule schedule(o.var_freeze_step, o.var_update_scaler, o.local_step_scaler,
                               o.local_step_clipper);
  int synced = 0, local = 0;
  for (int64_t t = 1; t <= kSteps; ++t) {
    const OneBitStep kind = schedule.next();
    INFO("step " << t << ": " << onebit_step_name(kind));
    const double spread = max_diff(got[1][t - 1], got[0][t - 1]);
    if (kind == OneBitStep::local) {
      CHECK(spread > 0.0);
      ++local;
    } else {
      CHECK(spread == 0.0);
      synced += kind == OneBitStep::local_sync;
    }
  }
  CHECK(synced >= 4);
  CHECK(local >= 4);
}

// Rank state at step `stop`, then the parameters after `steps`; resumed from the state.
}  // namespace
}  // namespace tessera::parallel
