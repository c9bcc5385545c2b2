#include "parallel/compression/onebit_optimizer.h"

#include <map>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/adamw.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"
#include "parallel/compression/onebit_adam.h"
#include "parallel/compression/onebit_lamb.h"
#include "parallel/compression/zero_one_adam.h"

namespace tessera::parallel {

OneBitOptimizer::OneBitOptimizer(std::vector<optim::ParamGroup> groups, Communicator& dp,
                                 const std::vector<int64_t>& buffers)
    : Optimizer(std::move(groups)), dp_(dp) {
  Device device = Device::cpu();
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) {
      TS_CHECK(p.tensor.dtype() == DType::f32 && p.tensor.is_contiguous(), "[onebit] parameter \"",
               p.name, "\": expected a contiguous f32 tensor, found ", p.tensor.str());
      device = p.tensor.device();
    }
  }
  for (const int64_t n : buffers) {
    compressors_.push_back(std::make_unique<CompressedAllReduce>(dp_, n, device));
  }
}

std::vector<int64_t> OneBitOptimizer::numel_per_group(
    const std::vector<optim::ParamGroup>& groups) {
  std::vector<int64_t> out;
  for (const optim::ParamGroup& g : groups) {
    int64_t n = 0;
    for (const NamedParameter& p : g.params) n += p.tensor.numel();
    out.push_back(n);
  }
  return out;
}

std::vector<int64_t> OneBitOptimizer::numel_of_all(const std::vector<optim::ParamGroup>& groups) {
  int64_t n = 0;
  for (const int64_t g : numel_per_group(groups)) n += g;
  return {n};
}

Tensor OneBitOptimizer::grad_of(const NamedParameter& p) {
  const Tensor g = p.tensor.grad();
  return g.defined() ? g.contiguous() : zeros(p.tensor.shape(), {DType::f32, p.tensor.device()});
}

void OneBitOptimizer::adam_step(const optim::ParamGroup& g, int64_t t,
                                const optim::AdamOptions& adam) {
  const kernels::AdamWParams ap{g.lr,           adam.beta1, adam.beta2, adam.eps,
                                g.weight_decay, t,          false,      true};
  std::vector<kernels::AdamWTensors> tensors;
  for (const NamedParameter& p : g.params) {
    tensors.push_back(
        {p.tensor, grad_of(p), state("exp_avg", p), state("exp_avg_sq", p), Tensor()});
  }
  kernels::adamw_step(tensors, ap);
}

StateDict OneBitOptimizer::rank_state() const {
  StateDict out;
  for (size_t b = 0; b < compressors_.size(); ++b) {
    out.emplace_back("worker_error." + std::to_string(b), compressors_[b]->worker_error());
    out.emplace_back("server_error." + std::to_string(b), compressors_[b]->server_error());
  }
  return out;
}

void OneBitOptimizer::load_rank_state(const StateDict& saved) {
  const StateDict want = rank_state();
  std::map<std::string, Tensor> given(saved.begin(), saved.end());
  TS_CHECK(given.size() == saved.size(), "[", name(), "] per-rank state: a name appears twice");
  StateDict extra;
  for (const auto& [key, t] : want) {
    const auto it = given.find(key);
    TS_CHECK(it != given.end(), "[", name(), "] per-rank state: expected \"", key,
             "\" (saved at the same world size), found none");
    TS_CHECK(it->second.shape() == t.shape() && it->second.dtype() == t.dtype(), "[", name(),
             "] per-rank state \"", key, "\": expected ", dtype_name(t.dtype()), " ",
             shape_str(t.shape()), ", found ", it->second.str());
    if (key.rfind("worker_error.", 0) != 0 && key.rfind("server_error.", 0) != 0) {
      extra.emplace_back(key, it->second);
    }
    given.erase(it);
  }
  TS_CHECK(given.empty(), "[", name(), "] unexpected per-rank state \"",
           given.empty() ? "" : given.begin()->first, "\"");
  NoGradGuard no_grad;
  const std::map<std::string, Tensor> by_key(saved.begin(), saved.end());
  for (size_t b = 0; b < compressors_.size(); ++b) {
    compressors_[b]->load_errors(by_key.at("worker_error." + std::to_string(b)),
                                 by_key.at("server_error." + std::to_string(b)));
  }
  load_extra_rank_state(extra);
}

void OneBitOptimizer::reset_rank_state() {
  for (const auto& c : compressors_) c->reset_errors();
}

FlatView::FlatView(std::vector<Tensor> parts) : parts_(std::move(parts)) {
  for (const Tensor& t : parts_) numel_ += t.numel();
}

Tensor FlatView::gather() const {
  const Device device = parts_.empty() ? Device::cpu() : parts_.front().device();
  const Tensor flat = empty({numel_}, {DType::f32, device});
  int64_t offset = 0;
  for (const Tensor& t : parts_) {
    flat.narrow(0, offset, t.numel()).copy_(t.reshape({t.numel()}));
    offset += t.numel();
  }
  return flat;
}

void FlatView::scatter(const Tensor& flat) const {
  int64_t offset = 0;
  for (const Tensor& t : parts_) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.shape()));
    offset += t.numel();
  }
}

void momentum_update_(const Tensor& m, const Tensor& g, double beta1) {
  kernels::scale_(m, beta1);
  kernels::axpy_(m, g, 1.0 - beta1);
}

Tensor adam_denominator(const Tensor& v, double eps) {
  return kernels::binary(kernels::BinaryOp::add, kernels::unary(kernels::UnaryOp::sqrt, v),
                         scalar_tensor(eps, {DType::f32, v.device()}));
}

void adam_update_(const Tensor& p, const Tensor& m, const Tensor& denom, double lr, double wd) {
  const Tensor direction = kernels::binary(kernels::BinaryOp::div, m, denom);
  if (wd != 0.0) kernels::axpy_(direction, p, wd);
  kernels::axpy_(p, direction, -lr);
}

std::unique_ptr<OneBitOptimizer> make_onebit_optimizer(const optim::OptimizerConfig& config,
                                                       std::vector<optim::ParamGroup> groups,
                                                       Communicator& dp) {
  const OneBitConfig* onebit = onebit_config(config);
  TS_CHECK(onebit != nullptr,
           "[onebit] expected OneBitAdam, ZeroOneAdam or OneBitLamb, found another optimizer type");
  switch (onebit->kind) {
    case OneBitKind::adam:
      return std::make_unique<OneBitAdam>(std::move(groups), dp, config.adam, onebit->options);
    case OneBitKind::zero_one_adam:
      return std::make_unique<ZeroOneAdam>(std::move(groups), dp, config.adam, onebit->options);
    case OneBitKind::lamb:
      return std::make_unique<OneBitLamb>(std::move(groups), dp, config.lamb, onebit->options);
  }
  TS_INTERNAL_ASSERT(false, "unhandled 1-bit optimizer kind");
  return nullptr;
}

}  // namespace tessera::parallel
