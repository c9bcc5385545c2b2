// Mixed-precision ZeRO (Note [Mixed precision] in parallel/zero/zero_optimizer.h) on thread
// ranks: bf16 and fp16 at stages 0-3 and 1-4 ranks against the one-rank 16-bit run, with
// replicas bitwise equal; gradients on the wire in communication_data_type; bf16 gradients
// summed in f32 over micro-batches.
#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/parallel/zero_test_gpt.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

constexpr int kSteps = 6;
constexpr int64_t kGlobalRows = 24;  // per step, over all ranks and micro-batches
constexpr int64_t kGas = 2;
constexpr int64_t kT = 6;

GptConfig model_config() { return testing::zero_test_gpt(kT); }
optim::OptimizerConfig adamw() { return testing::zero_test_adamw(); }

struct Run {
  std::vector<double> losses;
  std::vector<double> norms;   // of the averaged gradient, before clipping
  std::vector<float> model;    // the 16-bit parameters, flat, as f32
  std::vector<float> masters;  // whole_parameters(), flat
  int64_t gradient_bytes = 0;  // sent by this rank while reducing gradients
};

// `world` thread ranks training the GPT in `precision` at `zero`, behind `link`; rank r's
// micro-batch m is rows [(m * world + r) * micro, + micro) of the step.
std::vector<Run> train(int world, const ZeroConfig& zero, const MixedPrecision& precision,
                       const SimulatedLink& link = {}) {
  const Tensor rows = testing::zero_test_rows(kSteps * kGlobalRows, kT);
  std::vector<Run> runs(static_cast<size_t>(world));
  run_thread_ranks(world, [&](Communicator& comm) {
    comm.set_simulated_link(link);
    Gpt model(model_config(), 1234);
    model.to(Device::cpu(), precision.dtype);
    ZeroOptimizer opt(
        comm, model,
        optim::decay_groups(model.named_parameters(), adamw().lr, adamw().weight_decay, true, {}),
        adamw(), zero, precision);
    Run& run = runs[static_cast<size_t>(comm.rank())];
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      const int64_t before = comm.stats().total_bytes_sent();
      const double loss =
          testing::zero_test_backward(opt, model, rows, s, kGlobalRows, kGas, world, comm.rank());
      run.gradient_bytes += comm.stats().total_bytes_sent() - before;
      const Tensor total = scalar_tensor(loss, {DType::f64});
      comm.all_reduce(total);
      run.losses.push_back(total.item<double>() / world);
      run.norms.push_back(opt.clip_grad_norm(1.0));
      opt.step();
    }
    testing::FlatValues values = testing::zero_test_values(opt, model, zero.stage < 3);
    run.model = std::move(values.model);
    run.masters = std::move(values.masters);
  });
  return runs;
}

MixedPrecision precision_of(DType dtype) {
  MixedPrecision p;
  p.dtype = dtype;
  p.scaler.initial_scale_power = 12;
  return p;
}

// Note [Overlapped reductions] in parallel/zero/gradient_reducer.h (and the gathers: stage
// 3's, and stages 1-2's after the step, Note [Gathers after the step]), in 16 bits: the
// operations started on the worker (behind a slow link, so that several are in flight while
// forward and backward go on) give the blocking run's bits, through the converted copies, the
// temporary reduce-scatter outputs, the f32 sums of earlier micro-batches and the all-reduce
// in place of reduce_scatter. A forward that read a block before its gather arrived would
// change the next step's loss.
TEST_CASE("overlapped 16-bit reductions give the blocking run's bits", "[zero][mixed]") {
  const SimulatedLink slow{.gbit_per_s = 1.0, .latency_us = 50};
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (bool reduce_scatter : {true, false}) {
        DYNAMIC_SECTION(dtype_name(dtype)
                        << " stage " << stage << " reduce_scatter " << reduce_scatter) {
          ZeroConfig zero;
          zero.stage = stage;
          zero.reduce_bucket_size = 997;
          zero.reduce_scatter = reduce_scatter;
          zero.stage3_param_persistence_threshold = 0;
          zero.stage3_prefetch_bucket_size = 5000;
          const std::vector<Run> blocking = train(3, zero, precision_of(dtype), slow);
          zero.overlap_comm = true;
          const std::vector<Run> overlapped = train(3, zero, precision_of(dtype), slow);
          for (int r = 0; r < 3; ++r) {
            INFO("rank " << r);
            CHECK(overlapped[r].losses == blocking[r].losses);
            CHECK(overlapped[r].norms == blocking[r].norms);
            CHECK(overlapped[r].model == blocking[r].model);
            CHECK(overlapped[r].masters == blocking[r].masters);
          }
        }
      }
    }
  }
}

TEST_CASE("bf16 and fp16 ZeRO at stages 0-3 and 1-4 ranks follow the one-rank run",
          "[zero][mixed]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    const Run want = train(1, ZeroConfig{}, precision_of(dtype)).front();
    // The sums' order differs from the one-rank run's, which moves a 16-bit value across a
    // rounding boundary now and then, and Adam carries it (largest relative difference seen
    // over these cases: 9.8e-4).
    const double tolerance = 3e-3;
    for (int stage = 0; stage <= 3; ++stage) {
      for (int world = 1; world <= 4; ++world) {
        for (int64_t bucket : {int64_t{500'000'000}, int64_t{997}}) {
          DYNAMIC_SECTION(dtype_name(dtype)
                          << ", stage " << stage << ", world " << world << ", bucket " << bucket) {
            ZeroConfig zero;
            zero.stage = stage;
            zero.reduce_bucket_size = bucket;
            // Stage 3: the LayerNorm weights (25) whole, every other parameter partitioned.
            zero.stage3_param_persistence_threshold = 30;
            const std::vector<Run> got = train(world, zero, precision_of(dtype));
            for (const Run& r : got) {
              REQUIRE(r.model == got[0].model);  // replicas agree bitwise
              REQUIRE(r.masters == got[0].masters);
              REQUIRE(r.losses == got[0].losses);
              REQUIRE(r.norms == got[0].norms);
            }
            for (int s = 0; s < kSteps; ++s) {
              INFO("step " << s);
              CHECK(std::abs(got[0].losses[s] - want.losses[s]) <= 2e-3 * want.losses[s]);
              CHECK(std::abs(got[0].norms[s] - want.norms[s]) <= 1e-2 * want.norms[s]);
            }
            CHECK(testing::relative_l2_error(got[0].masters, want.masters) <= tolerance);
            if (stage < 3) {
              CHECK(testing::relative_l2_error(got[0].model, want.model) <= tolerance);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("gradients go over the wire in communication_data_type", "[zero][mixed]") {
  for (int stage = 0; stage <= 2; ++stage) {
    INFO("stage " << stage);
    ZeroConfig zero;
    zero.stage = stage;
    MixedPrecision in_bf16 = precision_of(DType::bf16);  // default: the parameters' dtype
    MixedPrecision in_f32 = in_bf16;
    in_f32.communication = DType::f32;
    const std::vector<Run> half = train(2, zero, in_bf16);
    const std::vector<Run> full = train(2, zero, in_f32);
    REQUIRE(half[0].gradient_bytes > 0);
    CHECK(2 * half[0].gradient_bytes == full[0].gradient_bytes);
    CHECK(testing::relative_l2_error(half[0].masters, full[0].masters) <= 3e-3);
    for (int s = 0; s < kSteps; ++s) {
      CHECK(std::abs(half[0].norms[s] - full[0].norms[s]) <= 1e-2 * full[0].norms[s]);
    }
  }
}

// w (1) in bf16; loss_m = f32(w) * x_m, so micro-batch m's gradient is x_m.
struct OneWeight : Module {
  OneWeight() : w(from_vector(std::vector<float>{0.5f}, {1})) {
    register_parameter("w", w);
    to(Device::cpu(), DType::bf16);
  }
  Tensor w;
};

// The master after one SGD step (lr 1) on micro-batch gradients 1 then seven of 2^-9: a
// bf16 sum stays 1 (1 + 2^-9 rounds back to 1), an f32 one is 1 + 7 x 2^-9.
float after_small_gradients(int stage, std::optional<DType> accumulation) {
  OneWeight model;
  ZeroConfig zero;
  zero.stage = stage;
  MixedPrecision precision = precision_of(DType::bf16);
  precision.accumulation = accumulation;
  optim::OptimizerConfig sgd;
  sgd.type = optim::OptimizerType::sgd;
  sgd.lr = 1.0;
  std::vector<std::unique_ptr<Communicator>> comms = make_thread_group(1);
  ZeroOptimizer opt(*comms[0], model, {{model.named_parameters(), 1.0, 0.0}}, sgd, zero, precision);
  opt.zero_grad();
  for (int m = 0; m < 8; ++m) {
    const float x = m == 0 ? 1.0f : std::ldexp(1.0f, -9);
    opt.backward(sum(mul(cast(model.w, DType::f32), from_vector(std::vector<float>{x}, {1}))), 1.0,
                 m == 7);
  }
  opt.step();
  return opt.whole_parameters().front().second.to_vector<float>()[0];
}

TEST_CASE("bf16 gradients are summed in f32 over micro-batches unless bf16 is asked for",
          "[zero][mixed]") {
  const float f32_sum = 0.5f - (1.0f + 7 * std::ldexp(1.0f, -9));
  for (int stage = 0; stage <= 2; ++stage) {
    INFO("stage " << stage);
    CHECK(after_small_gradients(stage, std::nullopt) == f32_sum);
    CHECK(after_small_gradients(stage, DType::f32) == f32_sum);
  }
  for (int stage = 0; stage <= 1; ++stage) {
    INFO("stage " << stage);
    CHECK(after_small_gradients(stage, DType::bf16) == -0.5f);
  }
  CHECK(testing::error_of([] { after_small_gradients(2, DType::bf16); }) ==
        "[zero] stage 2 adds each micro-batch's reduced gradient into an f32 shard; expected "
        "f32 gradient accumulation, found bf16");
  CHECK(testing::error_of([] { after_small_gradients(0, DType::f16); }) ==
        "[zero] gradients accumulate in f32 or in the parameters' bf16; expected one of them, "
        "found f16");
}

}  // namespace
}  // namespace tessera::parallel
