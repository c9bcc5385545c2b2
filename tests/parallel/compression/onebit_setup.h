// The setup the 1-bit optimizer tests share (onebit_optimizers_test.cc, onebit_state_test.cc):
// three parameters in two groups, per-rank gradients that are functions of (rank, step,
// element), DeepSpeed-shaped options, and runs of an optimizer on thread ranks.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
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

namespace tessera::parallel::onebit_testing {

using Vec = std::vector<double>;

// Three parameters in two groups; 45 elements, a multiple of 8 W for no W.
inline const std::vector<Shape> kShapes = {{5, 7}, {7}, {3}};
inline constexpr double kLr[2] = {0.01, 0.02};
inline constexpr double kWd[2] = {0.1, 0.0};
inline int group_of(size_t param) { return param < 2 ? 0 : 1; }

inline double initial_value(size_t param, int64_t k) { return 0.3 * std::cos(0.3 * k + param); }

// Rank r's gradient of parameter i at step t.
inline double local_grad(int rank, int64_t step, size_t param, int64_t k) {
  return std::sin(0.7 * k + 1.3 * step + 0.5 * param + 2.1 * rank) * (1.0 + 0.2 * param) +
         0.05 * rank;
}

inline Vec grad_vec(int rank, int world, bool averaged, int64_t step, size_t param) {
  const int64_t n = numel_of(kShapes[param]);
  Vec g(n, 0.0);
  for (int64_t k = 0; k < n; ++k) {
    if (!averaged) {
      g[k] = local_grad(rank, step, param, k);
      continue;
    }
    for (int r = 0; r < world; ++r) g[k] += local_grad(r, step, param, k);
    g[k] /= world;
  }
  return g;
}

inline Tensor tensor_of(const Vec& v, const Shape& shape) {
  std::vector<float> f(v.begin(), v.end());
  return from_vector(f).view(shape).clone();
}

inline Vec values(const Tensor& t) {
  const std::vector<float> f = t.contiguous().to_vector<float>();
  return Vec(f.begin(), f.end());
}

// Fresh parameters in the two groups.
inline std::vector<optim::ParamGroup> make_groups() {
  std::vector<optim::ParamGroup> groups(2);
  for (size_t i = 0; i < kShapes.size(); ++i) {
    const int64_t n = numel_of(kShapes[i]);
    Vec v(n);
    for (int64_t k = 0; k < n; ++k) v[k] = initial_value(i, k);
    Tensor t = tensor_of(v, kShapes[i]);
    t.set_requires_grad(true);
    optim::ParamGroup& g = groups[group_of(i)];
    g.lr = kLr[group_of(i)];
    g.weight_decay = kWd[group_of(i)];
    g.params.push_back({"p" + std::to_string(i), t, {}});
  }
  return groups;
}

inline std::vector<Tensor> params_of(const std::vector<optim::ParamGroup>& groups) {
  std::vector<Tensor> out;
  for (const optim::ParamGroup& g : groups) {
    for (const NamedParameter& p : g.params) out.push_back(p.tensor);
  }
  return out;
}

// Sets rank r's gradients for step t: averaged over the world when the optimizer asks
// for a full-precision reduction (what ZeroOptimizer does), its own otherwise.
inline void set_grads(const std::vector<Tensor>& params, int rank, int world, bool averaged,
                      int64_t step) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].set_grad(tensor_of(grad_vec(rank, world, averaged, step, i), kShapes[i]));
  }
}

inline OneBitOptions onebit_options() {
  OneBitOptions o;
  o.freeze_step = 1 << 30;
  o.var_freeze_step = 1 << 30;
  o.var_update_scaler = 1 << 30;
  return o;
}

inline optim::AdamOptions adam_options() {
  optim::AdamOptions a;
  a.beta1 = 0.9;
  a.beta2 = 0.99;
  a.eps = 1e-6;
  a.bias_correction = false;
  return a;
}

inline optim::LambOptions lamb_options() {
  optim::LambOptions l;
  l.beta1 = 0.9;
  l.beta2 = 0.99;
  l.eps = 1e-6;
  l.bias_correction = false;
  l.max_coeff = 3.0;
  l.min_coeff = 0.01;
  return l;
}

enum class Kind { adam, zero_one, lamb };

inline std::unique_ptr<OneBitOptimizer> make(Kind kind, std::vector<optim::ParamGroup> groups,
                                             Communicator& comm, const OneBitOptions& o) {
  switch (kind) {
    case Kind::adam:
      return std::make_unique<OneBitAdam>(std::move(groups), comm, adam_options(), o);
    case Kind::zero_one:
      return std::make_unique<ZeroOneAdam>(std::move(groups), comm, adam_options(), o);
    case Kind::lamb:
      return std::make_unique<OneBitLamb>(std::move(groups), comm, lamb_options(), o);
  }
  return nullptr;
}

// Runs `steps` steps on `world` thread ranks; returns every rank's parameters after each
// step ([rank][step][param]).
using Trace = std::vector<std::vector<std::vector<Vec>>>;
inline Trace run_ranks(Kind kind, int world, const OneBitOptions& o, int64_t steps,
                       std::vector<int64_t>* all_to_all_calls = nullptr) {
  Trace trace(world);
  std::mutex mu;
  run_thread_ranks(world, [&](Communicator& comm) {
    std::vector<optim::ParamGroup> groups = make_groups();
    const std::vector<Tensor> params = params_of(groups);
    std::unique_ptr<OneBitOptimizer> opt = make(kind, std::move(groups), comm, o);
    std::vector<std::vector<Vec>> mine;
    for (int64_t t = 1; t <= steps; ++t) {
      set_grads(params, comm.rank(), world, opt->reduce_gradients_next(), t);
      opt->step();
      std::vector<Vec> now;
      for (const Tensor& p : params) now.push_back(values(p));
      mine.push_back(now);
    }
    std::lock_guard<std::mutex> lock(mu);
    trace[comm.rank()] = mine;
    if (all_to_all_calls && comm.rank() == 0) {
      all_to_all_calls->push_back(comm.stats()[CommOp::all_to_all].calls);
    }
  });
  return trace;
}

// The largest elementwise difference of two lists of parameters.
inline double max_diff(const std::vector<Vec>& a, const std::vector<Vec>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t k = 0; k < a[i].size(); ++k) d = std::max(d, std::abs(a[i][k] - b[i][k]));
  }
  return d;
}

}  // namespace tessera::parallel::onebit_testing
