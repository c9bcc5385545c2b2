#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

// sum(out * w) in f64.
double weighted_sum(const Tensor& out, const std::vector<double>& w) {
  const std::vector<double> v = out.to_vector<double>();
  double s = 0.0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

// Storage element of the logical row-major element `i` of a strided view.
int64_t storage_index(const Tensor& t, int64_t i) {
  int64_t off = t.storage_offset();
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.size(d)) * t.stride(d);
    i /= t.size(d);
  }
  return off;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& fn,
                          const TensorList& inputs, const GradcheckOptions& options) {
  for (const Tensor& t : inputs) {
    TS_CHECK(!t.requires_grad() || (t.dtype() == DType::f64 && t.device().is_cpu()),
             "[gradcheck] expected f64 CPU inputs, found ", t.str());
    if (t.requires_grad()) t.set_grad(Tensor());
  }
  Tensor out = fn(inputs);
  Generator gen(options.seed);
  Tensor w = randn(out.shape(), gen, {DType::f64});
  const std::vector<double> wv = w.to_vector<double>();
  backward(out, w.to(out.dtype()));

  GradcheckResult result;
  for (size_t k = 0; k < inputs.size() && result.ok; ++k) {
    const Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    const Tensor analytic = x.grad();
    const std::vector<double> a =
        analytic.defined() ? analytic.to_vector<double>() : std::vector<double>(x.numel(), 0.0);
    double* data = static_cast<double*>(x.storage().data());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t s = storage_index(x, i);
      const double orig = data[s];
      double plus, minus;
      {
        NoGradGuard no_grad;
        data[s] = orig + options.eps;
        plus = weighted_sum(fn(inputs), wv);
        data[s] = orig - options.eps;
        minus = weighted_sum(fn(inputs), wv);
        data[s] = orig;
      }
      const double numeric = (plus - minus) / (2.0 * options.eps);
      if (std::abs(a[i] - numeric) > options.atol + options.rtol * std::abs(numeric) ||
          !std::isfinite(a[i])) {
        result.ok = false;
        result.message = str_cat("input ", k, " ", x.str(), " element ", i, ": analytic ", a[i],
                                 " vs numeric ", numeric);
        break;
      }
    }
  }
  return result;
}

}  // namespace tessera
