// 16-bit ZeRO's model states per rank, counted by the CPU allocator, against Note [16-bit
// model states] in parallel/zero/memory_estimate.h (within 5%) and DeepSpeed's ZeRO-2 and
// ZeRO-3 estimators.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/factories.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/memory_estimate.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::parallel {
namespace {

// 1,081,345 parameters in five tensors of uneven sizes (no world size divides the total).
class Layers : public Module {
 public:
  explicit Layers(DType dtype) {
    const Shape shapes[] = {{512, 768}, {768}, {768, 896}, {896}, {1}};
    Generator gen(3);
    weights.reserve(std::size(shapes));  // register_parameter keeps the members' addresses
    for (size_t i = 0; i < std::size(shapes); ++i) {
      weights.push_back(randn(shapes[i], gen, {}, 0.0, 0.01));
      register_parameter("w" + std::to_string(i), weights.back());
    }
    to(Device::cpu(), dtype);
  }
  int64_t numel() const {
    int64_t n = 0;
    for (const Tensor& w : weights) n += w.numel();
    return n;
  }
  std::vector<Tensor> weights;
};

int64_t allocated() { return allocator_for(Device::cpu()).stats().allocated; }

struct Counted {
  int64_t per_rank = 0;  // allocator bytes of the optimizer's buffers, per rank
  int64_t reported = 0;  // ZeroOptimizer::model_state_bytes() of rank 0
  int64_t params = 0;
};

// `world` ranks build the model, then the optimizer and take a step of `micro_batches`; the
// allocator's live bytes after, less those before and less the models' own tensors (which
// the optimizer's flat buffers replace), over the ranks.
Counted count(DType dtype, int stage, int world, int micro_batches) {
  Counted c;
  int64_t before = 0;
  int64_t after = 0;
  run_thread_ranks(world, [&](Communicator& comm) {
    Layers model(dtype);
    comm.barrier();
    if (comm.rank() == 0) before = allocated();
    comm.barrier();
    {
      ZeroConfig zero;
      zero.stage = stage;
      zero.reduce_bucket_size = 300'000;  // several blocks
      optim::OptimizerConfig adamw;
      MixedPrecision precision;
      precision.dtype = dtype;
      precision.scaler.initial_scale_power = 4;  // no overflow: the step makes Adam's state
      ZeroOptimizer opt(comm, model, {{model.named_parameters(), 1e-3, 0.0}}, adamw, zero,
                        precision);
      opt.zero_grad();
      for (int m = 0; m < micro_batches; ++m) {
        Tensor loss = scalar_tensor(0.0);
        const ModuleCall call(model);  // stage 3 gathers the parameters for it
        for (const Tensor& w : model.weights) loss = add(loss, sum(cast(w, DType::f32)));
        opt.backward(loss, 1.0, m == micro_batches - 1);
      }
      opt.clip_grad_norm(1.0);
      opt.step();
      comm.barrier();
      if (comm.rank() == 0) {
        after = allocated();
        c.reported = opt.model_state_bytes().total();
        c.params = model.numel();
      }
      comm.barrier();
    }
  });
  const int64_t model_bytes = c.params * static_cast<int64_t>(itemsize(dtype));
  c.per_rank = (after - before) / world + model_bytes;
  return c;
}

TEST_CASE("16-bit ZeRO model states per rank, counted by the allocator, follow the table",
          "[zero][mixed][memory]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int world : {1, 2, 4}) {
        for (int micro_batches : {1, 2}) {
          DYNAMIC_SECTION(dtype_name(dtype) << ", stage " << stage << ", world " << world << ", "
                                            << micro_batches << " micro-batches") {
            const Counted c = count(dtype, stage, world, micro_batches);
            const bool f32_sum = dtype == DType::bf16 && micro_batches > 1;
            const double formula =
                static_cast<double>(mixed_model_state_bytes(stage, c.params, world, f32_sum));
            INFO("allocator " << c.per_rank << " B, optimizer says " << c.reported << " B, formula "
                              << formula << " B");
            CHECK(std::abs(c.per_rank - formula) <= 0.05 * formula);
            CHECK(std::abs(c.reported - formula) <= 0.05 * formula);
            if (stage == 2) {
              CHECK(c.per_rank <= deepspeed_zero2_estimate(c.params, world, 1, false).device);
            }
            if (stage == 3) {  // DeepSpeed's 18 P / W, less its 4 L of gathered parameters
              CHECK(c.per_rank <= 1.05 * 18 * c.params / world);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("16-bit model states at stage 1 shrink as DeepSpeed's do: 4 + 16 / W bytes",
          "[zero][mixed][memory]") {
  const Counted one = count(DType::bf16, 1, 1, 1);
  const Counted four = count(DType::bf16, 1, 4, 1);
  // (4 + 16/4) / (4 + 16) of the one-rank bytes.
  CHECK(std::abs(static_cast<double>(four.per_rank) / one.per_rank - 8.0 / 20.0) <= 0.02);
}

}  // namespace
}  // namespace tessera::parallel
