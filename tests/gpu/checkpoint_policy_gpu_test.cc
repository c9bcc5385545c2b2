// activation_checkpointing's options on CUDA (parallel/engine/checkpoint_policy.h): a GPT
// that recomputes every block gives the same loss and gradients, bit for bit, whether its
// kept block inputs stay on the device or live in host memory (cpu_checkpointing) with the
// device synchronized at every segment boundary; a kept input comes back whole onto the
// device; profile times every segment.
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/factories.h"
#include "core/philox.h"
#include "models/gpt2/gpt.h"
#include "parallel/engine/checkpoint_policy.h"

namespace tessera {
namespace {

const Device kCuda = Device::cuda(0);
constexpr int kLayers = 3;

GptConfig config() {
  GptConfig c;
  c.vocab_size = 101;
  c.block_size = 17;
  c.n_layer = kLayers;
  c.n_head = 3;
  c.n_embd = 48;
  c.dropout = 0.1;  // the recomputation must redraw the same masks on the device
  return c;
}

struct Outcome {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

// One forward and backward on CUDA with every block recomputed under `ac`.
Outcome run(const parallel::ActivationCheckpointingConfig& ac,
            const std::shared_ptr<parallel::CheckpointTimes>& times) {
  Gpt model(config(), 11);
  model.to(kCuda, DType::f32);
  model.train();
  model.set_activation_checkpointing(1,
                                     parallel::make_checkpoint_policy(ac, nullptr, kCuda, times));
  std::vector<int32_t> x(2 * 17), y(2 * 17);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<int32_t>(philox4x32(i, 2, 8)[0] % 101);
    y[i] = static_cast<int32_t>(philox4x32(i, 2, 9)[0] % 101);
  }
  const Tensor loss = model.loss(model.forward(from_vector(x, {2, 17}).to(kCuda)),
                                 from_vector(y, {2, 17}).to(kCuda));
  Outcome o;
  o.loss = loss.to(Device::cpu()).item<float>();
  backward(loss);
  for (const NamedParameter& p : model.named_parameters()) {
    o.grads[p.name] = p.tensor.grad().to(Device::cpu()).to_vector<float>();
  }
  return o;
}

TEST_CASE("host-kept checkpoint inputs on CUDA give the same bits", "[gpu][checkpoint]") {
  const auto times = std::make_shared<parallel::CheckpointTimes>();
  const Outcome plain = run({}, times);
  parallel::ActivationCheckpointingConfig host;
  host.cpu_checkpointing = true;
  host.synchronize_checkpoint_boundary = true;
  host.profile = true;
  const Outcome got = run(host, times);
  CHECK(got.loss == plain.loss);
  CHECK(got.grads == plain.grads);
  CHECK(times->segments == kLayers);
  CHECK(times->backward_s > 0);

  // A kept input goes to the host and comes back whole onto the device.
  const CheckpointPolicy policy = parallel::make_checkpoint_policy(host, nullptr, kCuda, times);
  REQUIRE(policy.keep);
  REQUIRE(policy.at_boundary);
  Generator gen(3);
  const Tensor t = randn({4, 5, 6}, gen).to(kCuda);
  const Tensor back = policy.keep(t)();
  CHECK(back.device() == kCuda);
  CHECK(back.to(Device::cpu()).to_vector<float>() == t.to(Device::cpu()).to_vector<float>());
}

}  // namespace
}  // namespace tessera
