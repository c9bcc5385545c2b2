// ZeRO-Offload on CUDA (Note [Offload on a GPU] in parallel/zero/zero_optimizer.h): bf16 and
// fp16 at stages 1-3 with offload_optimizer "cpu" and "nvme" (and at stage 3 offload_param)
// on one GPU shared by two host-staged ranks follow the in-memory GPU run (the host's AdamW against
// the device's: the same arithmetic, not the same bits), keep the masters and the optimizer state
// off the GPU, and continue after a streamed checkpoint round trip (Note [Streamed checkpoints]).
#include <catch2/catch.hpp>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/host_staged_comm.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tiny_gpt.h"

namespace tessera::parallel {
namespace {

struct Run {
  std::vector<double> losses;
  std::vector<float> masters;        // whole_parameters() at the end, flat
  ModelStateBytes after_first_step;  // rank 0's
};

// Two thread ranks sharing cuda:0 train the one-layer GPT for 4 AdamW steps at `zero` in
// `dtype`; after step 2 each rank saves its shard (shard_pieces) and loads it back.
std::vector<Run> train(const ZeroConfig& zero, DType dtype) {
  std::vector<Run> runs(2);
  std::mutex mu;
  run_thread_ranks(2, [&](Communicator& cpu) {
    std::unique_ptr<Communicator> group = host_staged(cpu);
    Gpt model(tessera::testing::one_layer_gpt_config(), 99);
    model.to(Device::cuda(0), dtype);
    optim::OptimizerConfig adamw;
    adamw.lr = 1e-3;
    adamw.weight_decay = 0.01;
    MixedPrecision precision(dtype);
    precision.scaler.initial_scale_power = 8;
    ZeroOptimizer opt(
        *group, model,
        optim::decay_groups(model.named_parameters(), adamw.lr, adamw.weight_decay, true, {}),
        adamw, zero, precision);
    Run run;
    for (int s = 0; s < 4; ++s) {
      opt.zero_grad();
      double loss = 0;
      for (int m = 0; m < 2; ++m) {
        Generator g(static_cast<uint64_t>(100 + 10 * s + 2 * m + cpu.rank()));
        std::vector<int32_t> ids;
        for (double v : rand({6, 7}, g, {DType::f64}).to_vector<double>()) {
          ids.push_back(static_cast<int32_t>(v * 23));
        }
        const Tensor rows = from_vector(ids, {6, 7}).to(Device::cuda(0));
        const Tensor x = rows.narrow(1, 0, 6).contiguous(), y = rows.narrow(1, 1, 6).contiguous();
        const Tensor l = model.loss(model.forward(x), y);
        loss += l.to(Device::cpu()).to(DType::f64).item<double>();
        opt.backward(l, 0.5, m == 1);
      }
      run.losses.push_back(loss);
      opt.clip_grad_norm(1.0);
      opt.step();
      if (s == 0) run.after_first_step = opt.model_state_bytes();
      if (s == 1) opt.load_shard(materialize(opt.shard_pieces(true)));  // a checkpoint's trip
    }
    for (const auto& [name, t] : opt.whole_parameters()) {  // collective
      for (float v : t.to(Device::cpu()).to_vector<float>()) run.masters.push_back(v);
    }
    std::lock_guard<std::mutex> lock(mu);
    runs[static_cast<size_t>(cpu.rank())] = run;
  });
  return runs;
}

TEST_CASE("ZeRO-Offload on a GPU follows the in-memory run with the state off the device",
          "[gpu][zero][offload]") {
  REQUIRE(cuda::device_count() > 0);
  const auto dir = testing::fresh_dir("zero_offload_gpu");
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (const int stage : {1, 2, 3}) {
      ZeroConfig zero;
      zero.stage = stage;
      zero.reduce_bucket_size = 500;  // several blocks, chunks that cut parameters
      zero.stage3_param_persistence_threshold = 0;
      const std::vector<Run> memory = train(zero, dtype);
      // "cpu", "cpu" with pin_memory, "nvme".
      for (const int where : {0, 1, 2}) {
        const bool nvme = where == 2;
        // Stage 3 also with the 16-bit shard offloaded (ZeRO-Infinity), to the same place.
        for (const bool params : {false, true}) {
          if (params && stage != 3) continue;
          INFO(dtype_name(dtype) << " stage " << stage << (nvme ? " nvme" : " cpu")
                                 << (where == 1 ? " pinned" : "")
                                 << (params ? " with offload_param" : ""));
          ZeroConfig offloaded = zero;
          offloaded.offload_optimizer.device =
              nvme ? OffloadOptimizerConfig::Device::nvme : OffloadOptimizerConfig::Device::cpu;
          offloaded.offload_optimizer.nvme_path = (dir / "swap").string();
          offloaded.offload_optimizer.pin_memory = where == 1;
          offloaded.sub_group_size = 1000;  // several sub-groups
          if (params) {
            offloaded.offload_param.device =
                nvme ? OffloadParamConfig::Device::nvme : OffloadParamConfig::Device::cpu;
            offloaded.offload_param.nvme_path = (dir / "params").string();
            offloaded.offload_param.pin_memory = where == 1;
          }
          const std::vector<Run> host = train(offloaded, dtype);
          CHECK(host[1].masters == host[0].masters);
          const double error =
              tessera::testing::relative_l2_error(host[0].masters, memory[0].masters);
          WARN(dtype_name(dtype) << " stage " << stage << (nvme ? " nvme" : " cpu")
                                 << (params ? " with offload_param" : "")
                                 << ": relative L2 error of the masters against the in-memory "
                                    "run: "
                                 << error);
          CHECK(error <= 1e-5);
          for (size_t s = 0; s < memory[0].losses.size(); ++s) {
            CHECK(host[0].losses[s] == Approx(memory[0].losses[s]).epsilon(1e-4));
          }
          // Nothing of the optimizer on the device: its state and masters on the host (or,
          // with nvme, in the swap file); with offload_param, nor the 16-bit shard.
          const ModelStateBytes& m = host[0].after_first_step;
          CHECK(m.optimizer == 0);
          CHECK(m.params < memory[0].after_first_step.params);
          if (params) CHECK(m.params == 0);
          CHECK((m.on_host > 0) == !nvme);
          CHECK((m.on_nvme > 0) == nvme);
          CHECK(memory[0].after_first_step.on_host == 0);
        }
      }
    }
  }
}

TEST_CASE("offload on a GPU refuses what is not built yet", "[gpu][zero][offload]") {
  REQUIRE(cuda::device_count() > 0);
  const auto one = make_thread_group(1);
  // `dtype` at `stage` with `zero`'s offload: the error constructing the optimizer gives.
  const auto refusal = [&](int stage, DType dtype, bool params) {
    Gpt model(tessera::testing::one_layer_gpt_config(), 99);
    model.to(Device::cuda(0), dtype);
    ZeroConfig zero;
    zero.stage = stage;
    if (params) {
      zero.offload_param.device = OffloadParamConfig::Device::cpu;
    } else {
      zero.offload_optimizer.device = OffloadOptimizerConfig::Device::cpu;
    }
    return testing::error_of([&] {
      ZeroOptimizer(*one[0], model,
                    optim::decay_groups(model.named_parameters(), 1e-3, 0.0, true, {}),
                    optim::OptimizerConfig{}, zero, MixedPrecision(dtype));
    });
  };
  CHECK_THAT(refusal(2, DType::f32, false),
             Catch::Contains("expected ZeRO stage 1-3 with bf16 or fp16 parameters"));
  CHECK_THAT(refusal(0, DType::bf16, false),
             Catch::Contains("expected ZeRO stage 1-3 with bf16 or fp16 parameters"));
  CHECK_THAT(refusal(3, DType::f32, true),
             Catch::Contains("offload_param moves the 16-bit shard of 16-bit parameters"));
}

}  // namespace
}  // namespace tessera::parallel
