// A bf16 run trains to the same bits whatever the heap holds. Unrelated allocations between
// steps move where the kernels' scratch buffers land, and Eigen's transcendental functions
// take a scalar path for the elements before a buffer's first aligned address (Note
// [Aligned scratch] in kernels/cpu/widen.h). With cross_entropy's f32 row buffers aligned
// only as std::vector's (16 bytes), this case parted within 40 steps, one f32 master in
// its last bit; which steps part depends on the binary's heap history, so this is a canary
// for scratch buffers that follow the heap, not a proof that none does.
#include <catch2/catch.hpp>
#include <vector>

#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

// Per step, the f32 masters and the bf16 weights (as f32) of a bf16 GPT at ZeRO stage 2;
// with `churn`, tensors of odd sizes are made and dropped before each step.
std::vector<std::vector<float>> train(int steps, bool churn) {
  GptConfig cfg;
  cfg.vocab_size = 65;
  cfg.block_size = 64;
  cfg.n_layer = 4;
  cfg.n_head = 4;
  cfg.n_embd = 128;
  cfg.bias = true;
  std::vector<std::vector<float>> out;
  const testing::ScopedThreads two(2);  // run_thread_ranks passes the count to the rank
  run_thread_ranks(1, [&](Communicator& comm) {
    Gpt model(cfg, 5);
    model.to(Device::cpu(), DType::bf16);
    MixedPrecision precision;
    precision.dtype = DType::bf16;
    optim::OptimizerConfig adamw;
    adamw.weight_decay = 0.1;
    ZeroConfig zero;
    zero.stage = 2;
    ZeroOptimizer opt(comm, model,
                      optim::decay_groups(model.named_parameters(), adamw.lr, 0.1, true, {}), adamw,
                      zero, precision);
    Generator gen(3);
    for (int s = 0; s < steps; ++s) {
      opt.set_lr(1e-3 * (1 + 0.01 * s));
      std::vector<Tensor> held;
      if (churn) {
        for (int j = 0; j < 20; ++j) empty({(j * 7919 + s * 104729) % 3000000 + 100}).fill_(0.0);
        for (int j = 0; j < 5; ++j) held.push_back(empty({(j * 131 + s * 977) % 2000000 + 1000}));
      }
      opt.zero_grad();
      const Tensor x = rand({12, cfg.block_size}, gen, {}, 0.0, 65.0).to(DType::i32);
      opt.backward(model.loss(model.forward(x), x), 1.0, true);
      opt.clip_grad_norm(1.0);
      opt.step();
      std::vector<float> values;
      for (const auto& [name, t] : opt.whole_parameters()) {
        for (float v : t.to_vector<float>()) values.push_back(v);
      }
      for (const Tensor& p : model.parameters()) {
        for (float v : p.detach().to(DType::f32).to_vector<float>()) values.push_back(v);
      }
      out.push_back(values);
    }
  });
  return out;
}

TEST_CASE("bf16 training does not depend on what the heap holds", "[zero][mixed]") {
  const auto quiet = train(60, false), churned = train(60, true);
  for (size_t s = 0; s < quiet.size(); ++s) {
    INFO("step " << s);
    REQUIRE(churned[s] == quiet[s]);
  }
}

}  // namespace
}  // namespace tessera::parallel
