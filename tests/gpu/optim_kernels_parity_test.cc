// CPU vs CUDA parity of the optimizer steps (AdamW, LAMB, SGD) and the level-1 vector
// kernels (squared_norm, scale_, axpy_) in f32, f64 and the 16-bit dtypes. Each step runs
// once from the same state on both sides; the CPU runs in f64 on the same (rounded) values.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/adamw.h"
#include "kernels/blas1.h"
#include "kernels/lamb.h"
#include "kernels/sgd.h"
#include "tests/gpu/parity.h"

namespace tessera {
namespace {

using testing::both;
using testing::check_close;
using testing::Input;
using testing::random;
using testing::random_in;
using testing::random_t;
using testing::tol_for;

const std::vector<DType> kOptimDtypes = {DType::f32, DType::f64, DType::bf16};

// A parameter with its gradient and moments (or momentum buffer in m), all (N) contiguous.
struct State {
  Input p, g, m, v;
};

State make_state(const Shape& shape, uint64_t seed, DType dt) {
  return {random(shape, seed, dt), random(shape, seed + 1, dt),
          random(shape, seed + 2, dt, -0.1, 0.1), random(shape, seed + 3, dt, 0.0, 0.01)};
}

void check_state(const State& s, DType dt, bool moments) {
  const double tol = tol_for(dt, 1e-5);
  {
    INFO("param");
    check_close(s.p.dev, s.p.ref, dt, tol);
  }
  {
    INFO("exp_avg / momentum buffer");
    check_close(s.m.dev, s.m.ref, dt, tol);
  }
  if (moments) {
    INFO("exp_avg_sq");
    check_close(s.v.dev, s.v.ref, dt, tol);
  }
}

const Shape kParamShape{37, 129};  // 4773 elements: not a multiple of any vector width

TEST_CASE("adamw_step matches the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    kernels::AdamWParams params;
  };
  kernels::AdamWParams adamw{.lr = 1e-2, .weight_decay = 0.01, .step = 3};
  kernels::AdamWParams l2 = adamw;
  l2.adam_w_mode = false;
  kernels::AdamWParams raw = adamw;
  raw.bias_correction = false;
  raw.eps = 1e-3;
  const Case cases[] = {{"AdamW", adamw}, {"Adam with L2", l2}, {"no bias correction", raw}};
  for (DType dt : kOptimDtypes) {
    for (const Case& c : cases) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        State s = make_state(kParamShape, 150, dt);
        kernels::adamw_step(s.p.ref, s.g.ref, s.m.ref, s.v.ref, c.params);
        kernels::adamw_step(s.p.dev, s.g.dev, s.m.dev, s.v.dev, c.params);
        check_state(s, dt, true);
      }
    }
  }
}

TEST_CASE("the multi-tensor adamw_step equals the one-tensor kernel bit for bit", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  // 200 tensors (past the 192 of one table) of sizes around the 65536-element chunk, one of
  // them past the 2560 blocks of one launch (Note [Multi-tensor AdamW] in
  // kernels/cuda/optimizers.cu), and views at odd offsets (no vector access).
  std::vector<int64_t> sizes;
  for (int i = 0; i < 200; ++i) sizes.push_back(1 + (i * 40009) % 200000);
  constexpr int64_t kChunk = 65536;
  sizes[7] = 2560 * kChunk + 3;
  const kernels::AdamWParams hp{.lr = 1e-2, .weight_decay = 0.01, .step = 5};
  for (DType dt : kOptimDtypes) {
    DYNAMIC_SECTION(dtype_name(dt)) {
      std::vector<kernels::AdamWTensors> multi, single;
      for (size_t i = 0; i < sizes.size(); ++i) {
        const int64_t shift = i % 3 == 1 ? 1 : 0;  // a misaligned view
        const int64_t n = sizes[i] + shift;
        // A tensor over a chunk repeats a chunk's random values on the device (no CPU
        // reference: the comparison is between the two kernels).
        State s = make_state({std::min(n, kChunk)}, 500 + 4 * i, dt);
        if (n > kChunk) {
          for (Input* in : {&s.p, &s.g, &s.m, &s.v}) {
            const int64_t copies = (n + kChunk - 1) / kChunk;
            in->dev = in->dev.view({1, kChunk})
                          .expand({copies, kChunk})
                          .contiguous()
                          .view({copies * kChunk})
                          .narrow(0, 0, n)
                          .contiguous();
          }
        }
        auto part = [&](const Tensor& t) { return t.narrow(0, shift, sizes[i]); };
        multi.push_back({part(s.p.dev.clone()), part(s.g.dev), part(s.m.dev.clone()),
                         part(s.v.dev.clone()), Tensor()});
        single.push_back({part(s.p.dev), part(s.g.dev), part(s.m.dev), part(s.v.dev), Tensor()});
      }
      kernels::adamw_step(multi, hp);
      for (const kernels::AdamWTensors& t : single) {
        kernels::adamw_step(t.param, t.grad, t.exp_avg, t.exp_avg_sq, hp);
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        INFO("tensor " << i << " of " << sizes[i] << " elements");
        testing::check_bitwise(multi[i].param, single[i].param);
        testing::check_bitwise(multi[i].exp_avg, single[i].exp_avg);
        testing::check_bitwise(multi[i].exp_avg_sq, single[i].exp_avg_sq);
      }
    }
  }
}

// Note [Scaled AdamW] in kernels/cuda/optimizers.cu: the one pass gives the separate
// passes' bits on the device, with the grad_scale read there; a factor that is not finite
// changes nothing.
TEST_CASE("a scaled adamw_step with model copies equals scale_, adamw_step and copy_", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  // Tensors around the 65536-element chunk, one misaligned view among them.
  const std::vector<int64_t> sizes = {5, 4773, 65536 + 9, 200001, 17};
  // Both modes: L2 adds the decay to the scaled gradient, which must not fuse the product.
  const kernels::AdamWParams adamw{.lr = 1e-2, .weight_decay = 0.01, .step = 4};
  kernels::AdamWParams l2 = adamw;
  l2.adam_w_mode = false;
  for (const DType copy : {DType::bf16, DType::f16}) {
    for (const double factor : {1.0, 0.37, std::nan(""), static_cast<double>(INFINITY)}) {
      for (const kernels::AdamWParams& hp : {adamw, l2}) {
        DYNAMIC_SECTION(dtype_name(copy) << " copies, factor " << factor
                                         << (hp.adam_w_mode ? ", AdamW" : ", Adam with L2")) {
          std::vector<kernels::AdamWTensors> fused, separate;
          for (size_t i = 0; i < sizes.size(); ++i) {
            const int64_t shift = i == 1 ? 1 : 0;
            State s = make_state({sizes[i] + shift}, 700 + 4 * i, DType::f32);
            const auto part = [&](const Tensor& t) { return t.narrow(0, shift, sizes[i]); };
            const Tensor copy_buffer = zeros({sizes[i] + shift}, {copy, testing::kCuda});
            fused.push_back({part(s.p.dev.clone()), part(s.g.dev.clone()), part(s.m.dev.clone()),
                             part(s.v.dev.clone()), part(copy_buffer.clone())});
            separate.push_back(
                {part(s.p.dev), part(s.g.dev), part(s.m.dev), part(s.v.dev), part(copy_buffer)});
          }
          std::vector<kernels::AdamWTensors> before;
          for (const kernels::AdamWTensors& t : fused) {
            before.push_back({t.param.clone(), t.grad.clone(), t.exp_avg.clone(),
                              t.exp_avg_sq.clone(), t.model_copy.clone()});
          }
          kernels::adamw_step(fused, hp, scalar_tensor(factor, {DType::f64, testing::kCuda}));
          const bool skipped = !std::isfinite(factor);
          if (!skipped) {
            std::vector<kernels::AdamWTensors> plain;
            for (const kernels::AdamWTensors& t : separate) {
              kernels::scale_(t.grad, factor);
              plain.push_back({t.param, t.grad, t.exp_avg, t.exp_avg_sq, Tensor()});
            }
            kernels::adamw_step(plain, hp);
            for (const kernels::AdamWTensors& t : separate) t.model_copy.copy_(t.param);
          }
          const std::vector<kernels::AdamWTensors>& want = skipped ? before : separate;
          for (size_t i = 0; i < sizes.size(); ++i) {
            INFO("tensor " << i << " of " << sizes[i] << " elements");
            testing::check_bitwise(fused[i].param, want[i].param);
            testing::check_bitwise(fused[i].exp_avg, want[i].exp_avg);
            testing::check_bitwise(fused[i].exp_avg_sq, want[i].exp_avg_sq);
            testing::check_bitwise(fused[i].model_copy, want[i].model_copy);
            testing::check_bitwise(fused[i].grad, before[i].grad);  // read, not scaled
          }
        }
      }
    }
  }
}

TEST_CASE("lamb_step matches the CPU, trust ratio included", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    kernels::LambParams params;
    Shape shape;
    bool zero_param;  // |p| = 0: the ratio is 1
  };
  kernels::LambParams lamb{.lr = 1e-2, .weight_decay = 0.01, .step = 3};
  kernels::LambParams clamped = lamb;
  clamped.eps_inside_sqrt = true;
  clamped.max_coeff = 0.5;
  kernels::LambParams plain = lamb;
  plain.weight_decay = 0.0;
  const Case cases[] = {{"LAMB", lamb, kParamShape, false},
                        {"eps inside sqrt, clamped to 0.5", clamped, kParamShape, false},
                        {"many blocks", lamb, {(1 << 17) + 3}, false},
                        {"zero param", plain, kParamShape, true}};
  for (DType dt : kOptimDtypes) {
    for (const Case& c : cases) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        State s = make_state(c.shape, 160, dt);
        if (c.zero_param) s.p = both(zeros(c.shape), dt);
        const double want = kernels::lamb_step(s.p.ref, s.g.ref, s.m.ref, s.v.ref, c.params);
        const double got = kernels::lamb_step(s.p.dev, s.g.dev, s.m.dev, s.v.dev, c.params);
        // The ratio is a double from norms: f32 round-off for f32. In 16 bits the device takes
        // |u| from the moments as stored (rounded), which the f64 reference never rounds, and
        // with beta2 = 0.999 the rounded v drifts one way: 1.3e-4 on an H200 for 131075 bf16
        // elements.
        const double ratio_tol = dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 1e-5 : 1e-3;
        CHECK(got == Approx(want).epsilon(ratio_tol));
        if (c.zero_param) CHECK(got == 1.0);
        if (c.params.max_coeff == 0.5) CHECK(want == 0.5);
        check_state(s, dt, true);
      }
    }
  }
}

TEST_CASE("sgd_step matches the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    kernels::SgdParams params;
  };
  const Case cases[] = {
      {"no momentum", {.lr = 0.1, .weight_decay = 0.01}},
      {"momentum, dampening", {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}},
      {"Nesterov", {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}},
      {"first step", {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .first_step = true}}};
  for (DType dt : kOptimDtypes) {
    for (const Case& c : cases) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        State s = make_state(kParamShape, 170, dt);
        const bool momentum = c.params.momentum != 0.0;
        // Without momentum the buffer may be undefined.
        kernels::sgd_step(s.p.ref, s.g.ref, momentum ? s.m.ref : Tensor(), c.params);
        kernels::sgd_step(s.p.dev, s.g.dev, momentum ? s.m.dev : Tensor(), c.params);
        check_state(s, dt, false);
      }
    }
  }
}

TEST_CASE("squared_norm matches the CPU and reports non-finite values", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    DYNAMIC_SECTION("squared_norm " << dtype_name(dt)) {
      // Accumulated in f64 from exact squares: f32 round-off at most, for every dtype.
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      const Input strided = random_t({129, 37}, 180, dt);              // (129, 37) non-contiguous
      const Input longer = random({(int64_t{1} << 20) + 7}, 181, dt);  // (N)
      const Input empty_x = random({0}, 182, dt);                      // (0)
      for (const Input* x : {&strided, &longer, &empty_x}) {
        INFO("shape " << shape_str(x->dev.shape()));
        const double want = kernels::squared_norm(x->ref);
        CHECK(kernels::squared_norm(x->dev) == Approx(want).epsilon(tol));
      }
      for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
        INFO("holding " << bad);
        Tensor host = random({1000}, 183, dt).ref;
        host.narrow(0, 517, 1).fill_(bad);
        CHECK_FALSE(std::isfinite(kernels::squared_norm(both(host, dt).dev)));
      }
    }
  }
}

// The clip's norm and factor stay on the device (Note [Clip factor] in
// kernels/clip_factor.h): the device sum is squared_norm's, and the factor the CPU's formula
// on the same value, bit for bit (NaN for NaN).
TEST_CASE("add_squared_norm and clip_factor on the device equal the host's", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Input a = random({(int64_t{1} << 20) + 7}, 185, DType::f32);
  const Input b = random({4773}, 186, DType::bf16);
  const Tensor total = zeros({}, {DType::f64, testing::kCuda});
  kernels::add_squared_norm(a.dev, total);
  kernels::add_squared_norm(b.dev.narrow(0, 1, 4000), total);
  double host = 0.0;
  host += kernels::squared_norm(a.dev);
  host += kernels::squared_norm(b.dev.narrow(0, 1, 4000));
  CHECK(total.item<double>() == host);
  for (const double sq : {host, 1e-3, static_cast<double>(INFINITY), std::nan("")}) {
    for (const double loss_scale : {1.0, 4096.0}) {
      for (const double max_norm : {0.0, 1.0}) {
        INFO("squared norm " << sq << ", loss scale " << loss_scale << ", max_norm " << max_norm);
        const std::vector<double> dev =
            kernels::clip_factor(scalar_tensor(sq, {DType::f64, testing::kCuda}), loss_scale,
                                 max_norm, true)
                .to(Device::cpu())
                .to_vector<double>();
        const std::vector<double> cpu =
            kernels::clip_factor(scalar_tensor(sq, {DType::f64}), loss_scale, max_norm, true)
                .to_vector<double>();
        for (int k = 0; k < 2; ++k) {
          // NaNs alike (their payloads are the platforms'), everything else bit for bit.
          if (std::isnan(cpu[k])) {
            CHECK(std::isnan(dev[k]));
          } else {
            CHECK(std::memcmp(&dev[k], &cpu[k], sizeof(double)) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("scale_ and axpy_ match the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    DYNAMIC_SECTION("blas1 " << dtype_name(dt)) {
      const double tol = tol_for(dt, 1e-5);
      for (double factor : {-0.37, 0.0, 3.0}) {
        INFO("scale_ by " << factor);
        const Input x = random(kParamShape, 190, dt);  // (37, 129)
        kernels::scale_(x.ref, factor);
        kernels::scale_(x.dev, factor);
        check_close(x.dev, x.ref, dt, tol);
      }
      for (double alpha : {1.0, 0.75, -2.0}) {
        for (bool strided : {false, true}) {
          INFO("axpy_ alpha " << alpha << (strided ? ", non-contiguous x" : ""));
          const Input y = random(kParamShape, 191, dt);              // (37, 129)
          const Input x = random_in(kParamShape, 192, dt, strided);  // (37, 129)
          kernels::axpy_(y.ref, x.ref, alpha);
          kernels::axpy_(y.dev, x.dev, alpha);
          check_close(y.dev, y.ref, dt, tol);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
