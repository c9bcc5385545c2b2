// The whole GPT-2 training step on CUDA against the same step on the CPU: forward, loss and
// every parameter's gradient in f32 (TF32 GEMMs on the device), five AdamW steps through
// ZeroOptimizer in f32 and in bf16 with f32 masters, and run-to-run determinism on the
// device. The model has odd sizes (3 heads of 16, vocab 101 padded to 128, T = 17) so that
// no kernel sees only the multiples of 32 it was tuned for. The first case also runs with
// dropout everywhere, attention probabilities included: both devices draw the same masks
// (Note [Attention-probability dropout] in kernels/attention.h).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "core/philox.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "optim/optimizer.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/gpu/parity.h"

namespace tessera {
namespace {

const Device kCuda = Device::cuda(0);
constexpr uint64_t kSeed = 4321;
constexpr int64_t kB = 3;
constexpr int64_t kT = 17;
constexpr int kSteps = 5;

// f32 on the device runs its GEMMs on TF32 tensor cores (10-bit mantissa): ~1e-3 relative
// per product, a few of them deep.
constexpr double kLogitTol = 5e-3;
constexpr double kGradTol = 1e-2;
constexpr double kLossTrajectoryTol = 1e-2;
// bf16 parameters, activations and gradients (8-bit mantissa) against the f32 CPU run.
constexpr double kBf16LossTol = 5e-2;

GptConfig config(double dropout = 0.0) {
  GptConfig c;
  c.vocab_size = 101;  // padded to 128: the padding logits must stay out of the loss
  c.block_size = kT;
  c.n_layer = 2;
  c.n_head = 3;
  c.n_embd = 48;        // head dim 16, below the attention kernel's compiled width of 32
  c.dropout = dropout;  // the attention probabilities' too (attention_probs_dropout())
  return c;
}

// Token ids (B, T) and their targets (B, T) in [0, vocab_size), i32 on `device`.
std::pair<Tensor, Tensor> batch(Device device) {
  std::vector<int32_t> ids(static_cast<size_t>(2 * kB * kT));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(philox4x32(i, 0, 77)[0] % 101);
  }
  const std::vector<int32_t> x(ids.begin(), ids.begin() + kB * kT);
  const std::vector<int32_t> y(ids.begin() + kB * kT, ids.end());
  return {from_vector(x, {kB, kT}).to(device), from_vector(y, {kB, kT}).to(device)};
}

// ||got - want|| / ||want|| in f64; 0 when both are zero, infinite when only want is.
double relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = got.to_vector<double>();
  const std::vector<double> w = want.to_vector<double>();
  REQUIRE(g.size() == w.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff / norm);
}

optim::OptimizerConfig adamw() {
  optim::OptimizerConfig o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  return o;
}

// A training run's per-step losses and gradient norms and its final f32 parameters (on the
// CPU, in ZeroOptimizer's flat order).
struct Run {
  std::vector<double> losses, norms;
  StateDict params;
};

// kSteps AdamW steps on the same batch through ZeroOptimizer stage 0 (one rank), the model
// placed as the trainer places it: initialized in f32 on the CPU, then moved and converted.
Run train(Device device, DType dtype) {
  Gpt model(config(), kSeed);
  model.to(device, dtype);
  const auto comms = parallel::make_thread_group(1);  // a group of one moves no data
  const optim::OptimizerConfig oc = adamw();
  parallel::ZeroOptimizer zero(
      *comms[0], model,
      optim::decay_groups(model.named_parameters(), oc.lr, oc.weight_decay, true, {}), oc,
      parallel::ZeroConfig{}, parallel::MixedPrecision(dtype));
  const auto [idx, targets] = batch(device);
  Run run;
  for (int s = 0; s < kSteps; ++s) {
    zero.zero_grad();
    const Tensor loss = model.loss(model.forward(idx), targets);
    run.losses.push_back(loss.item<double>());
    zero.backward(loss, 1.0, /*boundary=*/true);
    run.norms.push_back(zero.clip_grad_norm(0.0));
    REQUIRE(zero.step());
  }
  for (const auto& [name, t] : zero.whole_parameters()) {
    REQUIRE(t.dtype() == DType::f32);
    run.params.emplace_back(name, t.to(Device::cpu()).clone());
  }
  return run;
}

TEST_CASE("GPT forward, loss and every gradient on CUDA match the CPU in f32", "[gpu][gpt]") {
  REQUIRE(cuda::device_count() > 0);
  const double dropout = GENERATE(0.0, 0.1);
  INFO("dropout " << dropout);
  Gpt cpu(config(dropout), kSeed);
  Gpt gpu(config(dropout), kSeed);
  cpu.train();
  gpu.train();
  gpu.to(kCuda, DType::f32);
  const std::vector<NamedParameter> cp = cpu.named_parameters();
  const std::vector<NamedParameter> gp = gpu.named_parameters();
  REQUIRE(cp.size() == gp.size());
  // The move is exact: any difference below comes from the kernels.
  for (size_t i = 0; i < cp.size(); ++i) {
    INFO(cp[i].name);
    REQUIRE(gp[i].name == cp[i].name);
    REQUIRE(gp[i].tensor.device() == kCuda);
    REQUIRE(gp[i].tensor.to_vector<float>() == cp[i].tensor.to_vector<float>());
  }

  const auto [cx, cy] = batch(Device::cpu());
  const auto [gx, gy] = batch(kCuda);
  const Tensor c_logits = cpu.forward(cx);
  const Tensor g_logits = gpu.forward(gx);
  REQUIRE(g_logits.device() == kCuda);
  REQUIRE(g_logits.shape() == Shape{kB, kT, config().padded_vocab_size()});
  testing::check_close(g_logits.detach(), c_logits.detach(), DType::f32, kLogitTol);

  const Tensor c_loss = cpu.loss(c_logits, cy);
  const Tensor g_loss = gpu.loss(g_logits, gy);
  const double want = c_loss.item<double>();
  CHECK(std::abs(want - std::log(101.0)) < 0.5);  // near-uniform predictions at init
  CHECK(std::abs(g_loss.item<double>() - want) <= kLogitTol * want);

  backward(c_loss);
  backward(g_loss);
  for (size_t i = 0; i < cp.size(); ++i) {
    INFO(cp[i].name);
    const Tensor cg = cp[i].tensor.grad();
    const Tensor gg = gp[i].tensor.grad();
    REQUIRE(cg.defined());
    REQUIRE(gg.defined());
    CHECK(gg.device() == kCuda);
    REQUIRE(gg.shape() == cg.shape());
    const double err = relative_error(gg, cg);
    INFO("relative error " << err);
    CHECK(err < kGradTol);
  }
}

TEST_CASE("five f32 AdamW steps on CUDA follow the CPU's loss trajectory", "[gpu][gpt][zero]") {
  REQUIRE(cuda::device_count() > 0);
  const Run want = train(Device::cpu(), DType::f32);
  const Run got = train(kCuda, DType::f32);
  // The reference trains: the comparison below must be finer than what the steps change.
  REQUIRE(want.losses.back() < want.losses.front() * (1 - 5 * kLossTrajectoryTol));
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s << ": cpu loss " << want.losses[s] << ", cuda loss " << got.losses[s]
                 << "; cpu grad norm " << want.norms[s] << ", cuda grad norm " << got.norms[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= kLossTrajectoryTol * want.losses[s]);
    CHECK(std::abs(got.norms[s] - want.norms[s]) <= kLossTrajectoryTol * want.norms[s]);
  }
}

TEST_CASE("five bf16 steps with f32 masters on CUDA track the f32 CPU run", "[gpu][gpt][zero]") {
  REQUIRE(cuda::device_count() > 0);
  const Run want = train(Device::cpu(), DType::f32);
  const Run got = train(kCuda, DType::bf16);
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s << ": cpu f32 loss " << want.losses[s] << ", cuda bf16 loss "
                 << got.losses[s]);
    REQUIRE(std::isfinite(got.losses[s]));
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= kBf16LossTol * want.losses[s]);
    if (s > 0) CHECK(got.losses[s] < got.losses[0]);  // it trains
  }
  // The masters stay f32: after the steps they hold values that bf16 cannot represent (a
  // master kept in bf16, or overwritten from the bf16 model, would not).
  for (const auto& [name, t] : got.params) {
    INFO(name);
    CHECK(t.to_vector<float>() != t.to(DType::bf16).to_vector<float>());
  }
}

TEST_CASE("two identical CUDA training runs are bitwise equal", "[gpu][gpt][zero]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dtype : {DType::f32, DType::bf16}) {
    DYNAMIC_SECTION(dtype_name(dtype)) {
      const Run a = train(kCuda, dtype);
      const Run b = train(kCuda, dtype);
      CHECK(a.losses == b.losses);
      CHECK(a.norms == b.norms);
      REQUIRE(a.params.size() == b.params.size());
      for (size_t i = 0; i < a.params.size(); ++i) {
        INFO(a.params[i].first);
        REQUIRE(a.params[i].first == b.params[i].first);
        CHECK(a.params[i].second.to_vector<float>() == b.params[i].second.to_vector<float>());
      }
    }
  }
}

}  // namespace
}  // namespace tessera
