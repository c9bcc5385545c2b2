#include "kernels/blas1.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"

namespace tessera {
namespace {

TEST_CASE("add_squared_norm adds squared_norm into a device scalar", "[blas1]") {
  Generator gen(3);
  const Tensor a = randn({1000, 7}, gen), b = randn({70001}, gen, {DType::bf16});
  const Tensor total = zeros({}, {DType::f64});
  kernels::add_squared_norm(a, total);
  kernels::add_squared_norm(b.narrow(0, 1, 500), total);  // a view at an odd offset
  double expected = 0.0;
  expected += kernels::squared_norm(a);
  expected += kernels::squared_norm(b.narrow(0, 1, 500));
  CHECK(total.item<double>() == expected);
  REQUIRE_THROWS_WITH(kernels::add_squared_norm(a, zeros({1}, {DType::f64})),
                      Catch::Contains("[add_squared_norm] expected total a 0-dim f64 tensor on "
                                      "cpu, found"));
}

// DeepSpeed's unscale_and_clip_grads (deepspeed/runtime/fp16/fused_optimizer.py), on the
// host in double: the reference the kernel's formula must give.
struct Expected {
  double factor, norm;
};
Expected unscale_and_clip(double sq, double loss_scale, double max_norm) {
  const double norm = std::sqrt(sq) / loss_scale;
  double combined = 1.0;
  if (max_norm > 0) {
    const double clip =
        (norm / 1.0 + 1e-6) / max_norm;  // DeepSpeed: ((norm / scale) + 1e-6) / clip
    if (clip > 1) combined = clip;
  }
  return {1.0 / (loss_scale * combined), norm};
}

TEST_CASE("clip_factor gives the unscale-and-clip factor and the norm", "[blas1]") {
  for (const double loss_scale : {1.0, 1024.0}) {
    for (const double max_norm : {0.0, 1.0, 1e6}) {
      for (const double unscaled : {0.25, 3.0, 1e3}) {
        INFO("loss scale " << loss_scale << ", max_norm " << max_norm << ", norm " << unscaled);
        const double sq = (unscaled * loss_scale) * (unscaled * loss_scale);
        const std::vector<double> got =
            kernels::clip_factor(scalar_tensor(sq, {DType::f64}), loss_scale, max_norm, true)
                .to_vector<double>();
        const Expected e = unscale_and_clip(sq, loss_scale, max_norm);
        CHECK(got[1] == e.norm);
        CHECK(got[0] == Approx(e.factor).epsilon(1e-14));
        // Within the clip: the gradients are only unscaled.
        if (max_norm <= 0 || unscaled + 1e-6 <= max_norm) CHECK(got[0] == 1.0 / loss_scale);
      }
    }
  }
}

TEST_CASE("clip_factor says an overflow with a NaN factor where it skips", "[blas1]") {
  for (const double sq : {static_cast<double>(INFINITY), std::nan("")}) {
    const Tensor s = scalar_tensor(sq, {DType::f64});
    const std::vector<double> skips = kernels::clip_factor(s, 256.0, 1.0, true).to_vector<double>();
    CHECK(std::isnan(skips[0]));
    CHECK_FALSE(std::isfinite(skips[1]));
    // Without a loss scaler (bf16, f32) a non-finite norm does not clip and does not skip.
    const std::vector<double> goes_on =
        kernels::clip_factor(s, 1.0, 1.0, false).to_vector<double>();
    CHECK(goes_on[0] == 1.0);
  }
  REQUIRE_THROWS_WITH(kernels::clip_factor(scalar_tensor(1.0, {DType::f64}), 0.0, 1.0, true),
                      Catch::Contains("[clip_factor] expected a loss scale > 0, found 0"));
}

}  // namespace
}  // namespace tessera
