// Note [One-pass mixed-precision step] in parallel/zero/zero_optimizer.h: prepare_step() +
// step(), which clips and steps in the optimizer's one pass from a factor computed where
// the gradients are, against clip_grad_norm() + step(), which reads the norm and scales the
// gradients first: the same norms, skipped steps, loss scales, masters and 16-bit models,
// bit for bit, in f32, bf16 and fp16 (overflows included), at stages 0-2 and 1-2 ranks.
// (kernels/adamw_test.cc proves the pass itself equal to the separate passes.)
#include <catch2/catch.hpp>
#include <cstring>

#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/parallel/zero_test_gpt.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

constexpr int kSteps = 5;
constexpr int64_t kGlobalRows = 8;
constexpr int64_t kGas = 2;
constexpr int64_t kT = 6;

struct Run {
  std::vector<double> norms;
  std::vector<bool> stepped;
  std::vector<double> scales;  // the loss scale after each step (1 without fp16)
  std::vector<float> model;    // the model's parameters, flat, as f32
  std::vector<float> masters;  // whole_parameters(), flat
  bool one_pass = false;       // one_pass_step()
};

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

std::vector<Run> train(int world, int stage, const MixedPrecision& precision, double max_norm,
                       bool prepared) {
  const Tensor rows = testing::zero_test_rows(kSteps * kGlobalRows, kT);
  std::vector<Run> runs(static_cast<size_t>(world));
  run_thread_ranks(world, [&](Communicator& comm) {
    Gpt model(testing::zero_test_gpt(kT), 1234);
    model.to(Device::cpu(), precision.dtype);
    const optim::OptimizerConfig adamw = testing::zero_test_adamw();
    ZeroConfig zero;
    zero.stage = stage;
    ZeroOptimizer opt(
        comm, model,
        optim::decay_groups(model.named_parameters(), adamw.lr, adamw.weight_decay, true, {}),
        adamw, zero, precision);
    Run& run = runs[static_cast<size_t>(comm.rank())];
    run.one_pass = opt.one_pass_step();
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      testing::zero_test_backward(opt, model, rows, s, kGlobalRows, kGas, world, comm.rank());
      if (prepared) {
        opt.prepare_step(max_norm);
        run.stepped.push_back(opt.step());
        run.norms.push_back(opt.grad_norm());
      } else {
        run.norms.push_back(opt.clip_grad_norm(max_norm));
        run.stepped.push_back(opt.step());
      }
      run.scales.push_back(opt.loss_scaler() ? opt.loss_scaler()->scale() : 1.0);
    }
    testing::FlatValues values = testing::zero_test_values(opt, model, true);
    run.model = std::move(values.model);
    run.masters = std::move(values.masters);
  });
  return runs;
}

TEST_CASE("a one-pass step gives the separate passes' bits", "[zero][one_pass]") {
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const int stage : {0, 1, 2}) {
      for (const int world : {1, 2}) {
        // 0.05 clips every step of this model; 0 turns clipping off.
        for (const double max_norm : {0.05, 0.0}) {
          DYNAMIC_SECTION(dtype_name(dtype) << ", stage " << stage << ", " << world
                                            << " ranks, max_norm " << max_norm) {
            MixedPrecision precision;
            precision.dtype = dtype;
            // fp16: 2^20 overflows the first steps, which must be skipped alike.
            precision.scaler.initial_scale_power = 20;
            precision.scaler.hysteresis = 1;
            const std::vector<Run> one = train(world, stage, precision, max_norm, true);
            const std::vector<Run> separate = train(world, stage, precision, max_norm, false);
            CHECK(one[0].one_pass);
            CHECK(same_bits(one[0].norms, separate[0].norms));  // an overflow's is NaN
            CHECK(one[0].stepped == separate[0].stepped);
            CHECK(one[0].scales == separate[0].scales);
            CHECK(one[0].masters == separate[0].masters);
            CHECK(one[0].model == separate[0].model);
            if (world == 2) CHECK(one[1].model == one[0].model);
            // The 16-bit model is its masters rounded (written by the pass itself).
            const int64_t n = static_cast<int64_t>(one[0].masters.size());
            CHECK(from_vector(one[0].masters, {n}).to(dtype).to(DType::f32).to_vector<float>() ==
                  one[0].model);
            if (dtype == DType::f16) {
              CHECK_FALSE(one[0].stepped.front());  // the overflow path ran
              CHECK(one[0].stepped.back());
            }
            if (max_norm > 0) CHECK(one[0].norms.back() > max_norm);  // the clip path ran
          }
        }
      }
    }
  }
}

TEST_CASE("steps take one pass only where the optimizer and the stage allow it",
          "[zero][one_pass]") {
  run_thread_ranks(1, [&](Communicator& comm) {
    const auto one_pass = [&](optim::OptimizerType type, int stage) {
      Gpt model(testing::zero_test_gpt(kT), 1234);
      optim::OptimizerConfig config = testing::zero_test_adamw();
      config.type = type;
      ZeroConfig zero;
      zero.stage = stage;
      ZeroOptimizer opt(
          comm, model,
          optim::decay_groups(model.named_parameters(), config.lr, config.weight_decay, true, {}),
          config, zero);
      return opt.one_pass_step();
    };
    CHECK(one_pass(optim::OptimizerType::adam, 0));
    CHECK(one_pass(optim::OptimizerType::adam, 2));
    CHECK_FALSE(one_pass(optim::OptimizerType::adam, 3));  // stage 3 rounds its own shard
    CHECK_FALSE(one_pass(optim::OptimizerType::lamb, 0));
    CHECK_FALSE(one_pass(optim::OptimizerType::sgd, 1));
  });
}

}  // namespace
}  // namespace tessera::parallel
