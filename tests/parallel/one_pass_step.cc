#include "tests/parallel/one_pass_step.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <utility>

#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/parallel/zero_test_gpt.h"

namespace tessera::parallel::testing {
namespace {

using tessera::testing::FlatValues;
using tessera::testing::zero_test_adamw;
using tessera::testing::zero_test_backward;
using tessera::testing::zero_test_gpt;
using tessera::testing::zero_test_rows;
using tessera::testing::zero_test_values;

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

std::vector<Run> train(Device device, int world, int stage, const MixedPrecision& precision,
                       double max_norm, bool prepared) {
  const Tensor rows = zero_test_rows(kSteps * kGlobalRows, kT);
  std::vector<Run> runs(static_cast<size_t>(world));
  run_thread_ranks(world, [&](Communicator& comm) {
    Gpt model(zero_test_gpt(kT), 1234);
    model.to(device, precision.dtype);
    const optim::OptimizerConfig adamw = zero_test_adamw();
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
      zero_test_backward(opt, model, rows, s, kGlobalRows, kGas, world, comm.rank());
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
    FlatValues values = zero_test_values(opt, model, true);
    run.model = std::move(values.model);
    run.masters = std::move(values.masters);
  });
  return runs;
}

}  // namespace

void check_one_pass_step(Device device, const std::vector<int>& worlds) {
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const int stage : {0, 1, 2}) {
      for (const int world : worlds) {
        // 0.05 clips every step of this model; 0 turns clipping off.
        for (const double max_norm : {0.05, 0.0}) {
          INFO(dtype_name(dtype) << ", stage " << stage << ", " << world << " ranks, max_norm "
                                 << max_norm);
          MixedPrecision precision;
          precision.dtype = dtype;
          // fp16: 2^20 overflows the first steps, which must be skipped alike.
          precision.scaler.initial_scale_power = 20;
          precision.scaler.hysteresis = 1;
          const std::vector<Run> one = train(device, world, stage, precision, max_norm, true);
          const std::vector<Run> separate = train(device, world, stage, precision, max_norm, false);
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

}  // namespace tessera::parallel::testing
