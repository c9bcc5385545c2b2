// Mixed precision on CUDA: fp16 training with DeepSpeed's dynamic loss scaler (the
// trajectory of tests/parallel/fp16_trajectory.h, which tests/parallel/mixed_precision_test.cc
// runs on the CPU), and bf16 and f32 ZeRO stages 0-3 (sharded masters, 16-bit reductions,
// stage 3's partitioned parameters gathered around module calls: Note [Mixed precision] in
// parallel/zero/zero_optimizer.h) on one GPU shared by two host-staged ranks (Note
// [Host-staged communication]), against the same run on the CPU.
#include <catch2/catch.hpp>
#include <mutex>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/host_staged_comm.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/parallel/fp16_trajectory.h"
#include "tests/testing.h"
#include "tests/tiny_gpt.h"

namespace tessera::parallel {
namespace {

TEST_CASE("fp16 on CUDA: the loss scale trajectory and the f32 masters against CPU AdamW",
          "[gpu][zero][mixed]") {
  REQUIRE(cuda::device_count() > 0);
  testing::check_fp16_trajectory(Device::cuda(0));
}

// Every rank's f32 masters after 4 AdamW steps in `dtype` at ZeRO `stage` on 2 thread ranks
// on `device`, reducing in `dtype` through host_staged.
std::vector<std::vector<float>> train(int stage, Device device, DType dtype) {
  std::vector<std::vector<float>> out(2);
  std::mutex mu;
  run_thread_ranks(2, [&](Communicator& cpu) {
    std::unique_ptr<Communicator> group = host_staged(cpu);
    Gpt model(tessera::testing::one_layer_gpt_config(), 99);
    model.to(device, dtype);
    optim::OptimizerConfig adamw;
    adamw.lr = 1e-3;
    adamw.weight_decay = 0.01;
    ZeroConfig zero;
    zero.stage = stage;
    zero.reduce_bucket_size = 500;  // several blocks, chunks that cut parameters
    ZeroOptimizer opt(
        *group, model,
        optim::decay_groups(model.named_parameters(), adamw.lr, adamw.weight_decay, true, {}),
        adamw, zero, MixedPrecision(dtype));
    for (int s = 0; s < 4; ++s) {
      opt.zero_grad();
      for (int m = 0; m < 2; ++m) {  // two micro-batches: bf16 sums in f32 at stages 0-1
        Generator g(static_cast<uint64_t>(100 + 10 * s + 2 * m + cpu.rank()));
        std::vector<int32_t> ids;
        for (double v : rand({6, 7}, g, {DType::f64}).to_vector<double>()) {
          ids.push_back(static_cast<int32_t>(v * 23));
        }
        const Tensor rows = from_vector(ids, {6, 7}).to(device);
        const Tensor x = rows.narrow(1, 0, 6).contiguous(), y = rows.narrow(1, 1, 6).contiguous();
        opt.backward(model.loss(model.forward(x), y), 0.5, m == 1);
      }
      opt.clip_grad_norm(1.0);
      opt.step();
    }
    std::vector<float> flat;
    for (const auto& [name, t] : opt.whole_parameters()) {  // collective
      for (float v : t.to(Device::cpu()).to_vector<float>()) flat.push_back(v);
    }
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<size_t>(cpu.rank())] = flat;
  });
  return out;
}

TEST_CASE("bf16 and f32 ZeRO stages 0-3 on one GPU shared by two ranks follow the CPU run",
          "[gpu][zero][mixed]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (int stage = 0; stage <= 3; ++stage) {
      INFO(dtype_name(dtype) << " stage " << stage);
      const auto gpu = train(stage, Device::cuda(0), dtype);
      const auto cpu = train(stage, Device::cpu(), dtype);
      CHECK(gpu[1] == gpu[0]);
      // cuBLAS and the CPU round their bf16 products at other places; f32 runs TF32 GEMMs.
      const double error = tessera::testing::relative_l2_error(gpu[0], cpu[0]);
      WARN(dtype_name(dtype) << " stage " << stage
                             << ": relative L2 error of the GPU run against the CPU run: "
                             << error);
      CHECK(error <= 2e-2);
    }
  }
}

}  // namespace
}  // namespace tessera::parallel
