// Note [Gradient averaging] (parallel/zero/gradient_reducer.h): prescale_gradients and
// gradient_predivide_factor move the division by the world size before the reduction, so
// gradients whose sum over the ranks overflows f32 still average to a finite value, and
// every variant gives the same mean where nothing overflows.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "core/factories.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::parallel {
namespace {

class Weights : public Module {
 public:
  Weights() : w(zeros({5})) { register_parameter("w", w); }
  Tensor w;  // (5)
};

// The gradient norm rank 0 sees after one backward on 3 ranks at `stage`, each rank's
// gradient `g` in every element (loss = sum(w) * g).
double norm_after(int stage, float g, bool prescale, double predivide) {
  double norm = 0;
  run_thread_ranks(3, [&](Communicator& comm) {
    Weights model;
    ZeroConfig zero;
    zero.stage = stage;
    zero.prescale_gradients = prescale;
    zero.gradient_predivide_factor = predivide;
    optim::OptimizerConfig sgd;
    sgd.type = optim::OptimizerType::sgd;
    ZeroOptimizer opt(comm, model, {{model.named_parameters(), 0.1, 0.0}}, sgd, zero);
    opt.zero_grad();
    opt.backward(mul(sum(model.w), scalar_tensor(g)), 1.0, true);
    const double n = opt.clip_grad_norm(0.0);
    if (comm.rank() == 0) norm = n;
  });
  return norm;
}

TEST_CASE("dividing before the reduction keeps a sum that overflows f32 finite",
          "[zero][averaging]") {
  const float huge = 1.5e38f;  // three of them overflow f32 (3.4e38)
  const double mean_norm = std::sqrt(5.0) * huge;
  for (int stage = 0; stage <= 2; ++stage) {
    INFO("stage " << stage);
    CHECK(std::isinf(norm_after(stage, huge, false, 1.0)));  // sum, then divide
    CHECK(norm_after(stage, huge, true, 1.0) == Approx(mean_norm).epsilon(1e-6));
    CHECK(norm_after(stage, huge, false, 3.0) == Approx(mean_norm).epsilon(1e-6));
    CHECK(norm_after(stage, huge, false, 2.0) == Approx(mean_norm).epsilon(1e-6));
    // Where nothing overflows, every variant gives the mean.
    for (bool prescale : {false, true}) {
      CHECK(norm_after(stage, 0.75f, prescale, 1.0) == Approx(std::sqrt(5.0) * 0.75));
    }
  }
  auto comms = make_thread_group(1);
  Weights model;
  ZeroConfig zero;
  zero.gradient_predivide_factor = 0.0;
  CHECK_THROWS_WITH(ZeroOptimizer(*comms[0], model, {{model.named_parameters(), 0.1, 0.0}},
                                  optim::OptimizerConfig{}, zero),
                    "[zero] expected a gradient_predivide_factor > 0, found 0");
}

}  // namespace
}  // namespace tessera::parallel
