// gelu_mlp_partial (Note [Fused tensor-parallel MLP] in parallel/tensor/layers.h) against
// the separate layers, proj(gelu(fc(x))), on the CPU at model-parallel sizes 1 and 2, with
// the input gradients' sums blocking and overlapped, with and without biases: the output
// and every gradient the same bits (the CPU runs the same kernels), through reduce() and
// through start_reduce() and finish().
#include <catch2/catch.hpp>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/tensor/layers.h"

namespace tessera::parallel {
namespace {

struct Outcome {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
};

// The layers' output and gradients for one way of running them.
enum class Way { separate, fused, fused_started };

Outcome run(Communicator& group, AsyncCollectives* async, bool bias, Way way) {
  ColumnParallelLinear fc(8, 32, bias, group, false, 1, DType::f32, async);
  RowParallelLinear proj(32, 8, bias, group, true, DType::f32, async);
  {
    NoGradGuard no_grad;
    uint64_t seed = 10;
    for (Module* m : {static_cast<Module*>(&fc), static_cast<Module*>(&proj)}) {
      for (const NamedParameter& p : m->named_parameters()) {
        Generator gen(seed++ * 7 + static_cast<uint64_t>(group.rank()));
        p.tensor.copy_(randn(p.tensor.shape(), gen));
      }
    }
  }
  Generator gen(3);
  Tensor x = randn({2, 5, 8}, gen);
  x.set_requires_grad(true);
  Tensor y;
  switch (way) {
    case Way::separate:
      y = proj(gelu(fc(x)));
      break;
    case Way::fused:
      y = proj.reduce(gelu_mlp_partial(x, fc, proj));
      break;
    case Way::fused_started:
      y = proj.finish(proj.start_reduce(gelu_mlp_partial(x, fc, proj)));
      break;
  }
  backward(sum(mul(y, y)));
  if (async != nullptr) async->wait_all();
  Outcome o{y.to_vector<float>(), x.grad().to_vector<float>(), {}};
  for (Module* m : {static_cast<Module*>(&fc), static_cast<Module*>(&proj)}) {
    for (const NamedParameter& p : m->named_parameters()) {
      o.grads[class_name(*m) + "." + p.name] = p.tensor.grad().to_vector<float>();
    }
  }
  return o;
}

TEST_CASE("the fused tensor-parallel MLP gives the separate layers' bits", "[tensor_parallel]") {
  for (const int size : {1, 2}) {
    for (const bool overlap : {false, true}) {
      for (const bool bias : {true, false}) {
        DYNAMIC_SECTION("size " << size << (overlap ? ", overlapped" : ", blocking")
                                << (bias ? ", biases" : ", no biases")) {
          std::mutex mutex;
          std::vector<std::map<Way, Outcome>> got(static_cast<size_t>(size));
          run_thread_ranks(size, [&](Communicator& group) {
            std::unique_ptr<AsyncCollectives> async;
            if (overlap) async = std::make_unique<AsyncCollectives>(group);
            std::map<Way, Outcome> mine;
            for (const Way way : {Way::separate, Way::fused, Way::fused_started}) {
              if (way == Way::fused_started && !overlap) continue;  // start needs async
              mine[way] = run(group, async.get(), bias, way);
            }
            std::lock_guard<std::mutex> lock(mutex);
            got[static_cast<size_t>(group.rank())] = std::move(mine);
          });
          for (const std::map<Way, Outcome>& rank : got) {
            const Outcome& want = rank.at(Way::separate);
            for (const auto& [way, o] : rank) {
              INFO("way " << static_cast<int>(way));
              CHECK(o.y == want.y);
              CHECK(o.dx == want.dx);
              CHECK(o.grads == want.grads);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::parallel
