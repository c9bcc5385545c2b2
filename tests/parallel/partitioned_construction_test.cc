// Note [Partitioned construction] (autograd/module.h): a GPT built under a
// DeferredInitGuard holds no parameter memory; ZeRO stage 3 initializes it by name to the
// weights of an unpartitioned build, and construction's peak memory is the ranks' shards
// and a few parameters, not the ranks' whole models.
#include <catch2/catch.hpp>
#include <map>
#include <optional>

#include "core/allocator.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

// 210,304 parameters; the largest, c_fc.weight and mlp.c_proj.weight, 16,384 each.
GptConfig model_config() {
  GptConfig c;
  c.vocab_size = 65;
  c.block_size = 32;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 64;
  c.bias = true;
  return c;
}

constexpr int64_t kLargest = 64 * 256;

ZeroConfig stage3() {
  ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 100;  // the LayerNorm and most bias vectors stay whole
  return z;
}

// Every parameter by name, from a whole model or from ZeroOptimizer::whole_parameters().
std::map<std::string, std::vector<float>> by_name(const StateDict& whole) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : whole) out[name] = t.to_vector<float>();
  return out;
}

StateDict parameters_of(const Module& m) {
  StateDict out;
  for (const NamedParameter& p : m.named_parameters()) out.emplace_back(p.name, p.tensor);
  return out;
}

struct Built {
  std::map<std::string, std::vector<float>> weights;  // whole_parameters() of rank 0
  int64_t peak = 0;  // the allocator's peak over construction, less what was live before
};

// `world` thread ranks build the GPT (under a DeferredInitGuard when `partitioned`) in
// `dtype` and hand it to a stage 3 ZeroOptimizer.
Built build(int world, bool partitioned, DType dtype) {
  Built b;
  Allocator& cpu = allocator_for(Device::cpu());
  const int64_t before = cpu.stats().allocated;
  cpu.reset_peak();
  run_thread_ranks(world, [&](Communicator& comm) {
    std::optional<DeferredInitGuard> deferred;
    if (partitioned) deferred.emplace();
    Gpt model(model_config(), 42);
    deferred.reset();
    for (const NamedParameter& p : model.named_parameters()) {
      REQUIRE(p.tensor.materialized() == !partitioned);
    }
    model.to(Device::cpu(), dtype);
    MixedPrecision precision;
    precision.dtype = dtype;
    ZeroOptimizer opt(
        comm, model, {{model.named_parameters(), 1e-3, 0.0}}, {}, stage3(), precision,
        [&model](const std::string& name, const Tensor& out) { model.init_parameter(name, out); });
    comm.barrier();
    if (comm.rank() == 0) b.peak = cpu.stats().peak_allocated - before;
    const StateDict whole = opt.whole_parameters();  // collective
    if (comm.rank() == 0) b.weights = by_name(whole);
  });
  return b;
}

TEST_CASE("a GPT built partitioned holds no parameter memory until stage 3 initializes it",
          "[zero][partitioned]") {
  const DeferredInitGuard deferred;
  Gpt model(model_config(), 42);
  for (const NamedParameter& p : model.named_parameters()) {
    INFO(p.name);
    CHECK(!p.tensor.materialized());
    CHECK(p.tensor.dtype() == DType::f32);
  }
  model.to(Device::cpu(), DType::bf16);
  CHECK(!model.named_parameters().front().tensor.materialized());
  CHECK(model.named_parameters().front().tensor.dtype() == DType::bf16);
  CHECK(testing::error_of([&] {
          model.named_parameters().front().tensor.to_vector<float>();
        }).find("reads memory that has been released") != std::string::npos);
  CHECK(testing::error_of([&] { model.init_parameter("h.0.nope", zeros({2})); }) ==
        "[gpt2] init_parameter: expected a parameter of this model, found \"h.0.nope\"");
  auto comms = make_thread_group(1);
  ZeroConfig stage2;
  stage2.stage = 2;
  CHECK(testing::error_of([&] {
          ZeroOptimizer(*comms[0], model, {{model.named_parameters(), 1e-3, 0.0}}, {}, stage2,
                        MixedPrecision(DType::bf16));
        }) ==
        "[zero] parameter \"transformer.wte.weight\" has no values (built under a "
        "DeferredInitGuard); expected ZeRO stage 3 with the model's init_parameter, found stage 2");
}

TEST_CASE("stage 3 initializes a partitioned GPT by name to the unpartitioned build's weights",
          "[zero][partitioned]") {
  // The reference: one whole model, initialized by its constructor.
  Gpt whole(model_config(), 42);
  const std::map<std::string, std::vector<float>> f32 = by_name(parameters_of(whole));
  whole.to(Device::cpu(), DType::bf16);
  std::map<std::string, std::vector<float>> bf16;
  for (const NamedParameter& p : whole.named_parameters()) {
    bf16[p.name] = p.tensor.to_vector<float>();
  }
  for (int world : {1, 2, 3, 4}) {
    INFO("world " << world);
    CHECK(build(world, true, DType::f32).weights == f32);
    CHECK(build(world, true, DType::bf16).weights == bf16);
  }
}

TEST_CASE("partitioned construction peaks at the shards and a few parameters, not whole models",
          "[zero][partitioned]") {
  const int world = 4;
  const int64_t params = model_config().num_parameters();
  const Built whole = build(world, false, DType::f32);
  const Built partitioned = build(world, true, DType::f32);
  // Each unpartitioned rank holds its whole f32 model at once.
  CHECK(whole.peak >= world * 4 * params);
  // Each partitioned rank: its f32 parameter and gradient shards, the persistent vectors,
  // and one parameter whole at a time (drawn in f32 and padded: two copies of it).
  const int64_t shard = (params + world - 1) / world;
  const int64_t bound = world * (8 * shard + 2 * 4 * kLargest) + 64 * 1024;
  INFO("peak: whole " << whole.peak << " B, partitioned " << partitioned.peak << " B, bound "
                      << bound << " B");
  CHECK(partitioned.peak <= bound);
  CHECK(partitioned.peak < whole.peak / 2);
}

}  // namespace
}  // namespace tessera::parallel
