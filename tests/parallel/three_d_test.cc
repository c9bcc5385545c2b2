// 3D parallelism: GPT on 8 thread ranks as (pipe, data, model) =
// (2, 2, 2), each replica a 2-stage pipeline of 2-way tensor slices, with ZeRO stage 1
// over the data groups, gradient clipping by the global norm (over each replica's
// pipe x model group, replicated and tied copies counted once) and ten AdamW steps, against
// one process accumulating the same global batch: the losses, the gradient norms and
// every parameter (each rank's slice) within 1e-5 relative.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/factories.h"
#include "core/philox.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/engine/engine.h"
#include "parallel/pipeline/partition.h"
#include "parallel/tensor/mappings.h"
#include "parallel/topology.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/testing.h"

namespace tessera {
namespace {

constexpr double kTol = 1e-5;
constexpr uint64_t kSeed = 21;
constexpr int kSteps = 10;
constexpr int kMicro = 3;  // micro-batches per data rank and step
constexpr int kData = 2;

GptConfig config(double dropout = 0.0) {
  GptConfig c;
  c.vocab_size = 61;  // padded to 128: 64 rows per tensor-parallel rank
  c.block_size = 9;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 16;
  c.dropout = dropout;
  // No biases: the key bias does not change the loss, so its gradient is rounding noise
  // that Adam turns into full-size steps (see model_config() in zero_optimizer_test.cc).
  c.bias = false;
  return c;
}

optim::OptimizerConfig adamw() {
  optim::OptimizerConfig o;
  o.lr = 3e-2;
  o.weight_decay = 0.1;
  return o;
}

// Micro-batch k of data rank d at `step`: (2, 9) random token ids, each labelled 5 x mod 61.
parallel::pipeline::MicroBatch micro_batch(int step, int d, int k) {
  std::vector<int64_t> x(2 * 9), y(2 * 9);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint64_t r = philox4x32(i, (step * kData + d) * kMicro + k, 3)[0];
    x[i] = r % 61;
    y[i] = (x[i] * 5) % 61;
  }
  return {from_vector(x, {2, 9}), from_vector(y, {2, 9})};
}

struct Trace {
  std::vector<double> losses, norms;
  int64_t pipe_bytes = 0;                // sent over the pipe group
  std::map<std::string, Tensor> params;  // this rank's (slices of) parameters after training
  std::map<std::string, Placement> placements;
};

Trace single_process() {
  Gpt model(config(), kSeed);
  const auto one = parallel::make_thread_group(1);
  const optim::OptimizerConfig oc = adamw();
  parallel::ZeroOptimizer zero(
      *one[0], model,
      optim::decay_groups(model.named_parameters(), oc.lr, oc.weight_decay, true, {}), oc,
      parallel::ZeroConfig{});
  Trace t;
  const int total = kData * kMicro;
  for (int step = 0; step < kSteps; ++step) {
    zero.zero_grad();
    double loss = 0;
    for (int d = 0; d < kData; ++d) {
      for (int k = 0; k < kMicro; ++k) {
        const auto mb = micro_batch(step, d, k);
        const Tensor l = model.loss(model.forward(mb.inputs), mb.labels);
        loss += l.item<double>() / total;
        zero.backward(l, 1.0 / total, d == kData - 1 && k == kMicro - 1);
      }
    }
    t.losses.push_back(loss);
    t.norms.push_back(zero.clip_grad_norm(1.0));
    REQUIRE(zero.step());
  }
  for (const NamedParameter& p : model.named_parameters()) {
    t.params[p.name] = p.tensor.detach().clone();
  }
  return t;
}

// One rank of the 3D run, through the engine (its pipeline executor, tied-weight reduction,
// ZeRO-1 and clipping), `steps` steps; `partitioned`: stage-to-stage transfers in
// tensor-parallel pieces (DeepSpeed's pipe_partitioned and grad_partitioned).
Trace rank_run(parallel::Communicator& world, const parallel::ProcessGrid& grid, int steps = kSteps,
               bool partitioned = true, double dropout = 0.0) {
  parallel::ParallelGroups g = parallel::make_parallel_groups(world, grid);
  const GptConfig cfg = config(dropout);
  const std::vector<int> parts =
      parallel::pipeline::partition_layers(pipeline_layers(cfg), grid.pipe_size(), "parameters");
  Gpt model(cfg, kSeed, g.model.get(), part_of_stage(cfg, parts, g.coord.pipe));
  parallel::EngineConfig ec;
  ec.optimizer = adamw();
  ec.zero.stage = 1;
  ec.gradient_clipping = 1.0;
  ec.batch.gradient_accumulation_steps = kMicro;
  ec.pipeline.stages = grid.pipe_size();
  ec.tensor_parallel.tp_size = grid.model_size();
  ec.pipeline.pipe_partitioned = ec.pipeline.grad_partitioned = partitioned;
  parallel::Engine engine(ec, model,
                          optim::decay_groups(model.named_parameters(), ec.optimizer.lr,
                                              ec.optimizer.weight_decay, true, {}),
                          Device::cpu(), *g.data, &g);
  Trace t;
  for (int step = 0; step < steps; ++step) {
    std::vector<parallel::pipeline::MicroBatch> mbs;
    for (int k = 0; k < kMicro; ++k) mbs.push_back(micro_batch(step, g.coord.data, k));
    const parallel::StepStats s = engine.train_batch(mbs);
    t.norms.push_back(s.grad_norm);
    t.losses.push_back(s.loss);
  }
  for (const NamedParameter& p : model.named_parameters()) {
    t.params[p.name] = p.tensor.detach().clone();
    t.placements[p.name] = p.placement;
  }
  t.pipe_bytes = g.pipe->stats().total_bytes_sent();
  return t;
}

// Every rank's trace of a 3D run.
std::vector<Trace> run_3d(const parallel::ProcessGrid& grid, int steps, bool partitioned,
                          double dropout = 0.0) {
  std::vector<Trace> got(grid.world_size());
  std::mutex mutex;
  parallel::run_thread_ranks(grid.world_size(), [&](parallel::Communicator& world) {
    Trace t = rank_run(world, grid, steps, partitioned, dropout);
    std::lock_guard<std::mutex> lock(mutex);
    got[world.rank()] = std::move(t);
  });
  return got;
}

TEST_CASE("3D (pipe, data, model) = (2, 2, 2) with ZeRO-1 equals one process",
          "[3d][pipeline][tensor_parallel][zero]") {
  const Trace want = single_process();
  // The run learns: agreement below is finer than what training changes.
  REQUIRE(want.losses.back() < 0.9 * want.losses.front());
  const parallel::ProcessGrid grid(2, kData, 2);
  const std::vector<Trace> got = run_3d(grid, kSteps, true);
  std::map<std::string, int> holders;
  for (int r = 0; r < grid.world_size(); ++r) {
    INFO("rank " << r << " (" << grid.describe(r) << ")");
    const parallel::GridCoord c = grid.coord(r);
    for (int s = 0; s < kSteps; ++s) {
      INFO("step " << s << ": loss " << got[r].losses[s] << " vs " << want.losses[s] << ", norm "
                   << got[r].norms[s] << " vs " << want.norms[s]);
      CHECK(std::abs(got[r].losses[s] - want.losses[s]) <= kTol * want.losses[s]);
      CHECK(std::abs(got[r].norms[s] - want.norms[s]) <= kTol * want.norms[s]);
    }
    for (const auto& [name, t] : got[r].params) {
      INFO(name);
      const Placement& p = got[r].placements.at(name);
      const Tensor full = want.params.at(name);
      const Tensor expect =
          p.kind == Placement::Kind::sharded
              ? parallel::model_parallel_slice(full, p.dim, p.parts, c.model, grid.model_size())
              : full;
      const std::vector<float> e = expect.to_vector<float>();
      if (std::all_of(e.begin(), e.end(), [](float v) { return v == 0.0f; })) {
        CHECK(t.to_vector<float>() == e);  // vocabulary padding rows stay zero
      } else {
        CHECK(testing::relative_l2_error(t.to_vector<float>(), e) <= kTol);
      }
      ++holders[name];
    }
  }
  // Every parameter is held somewhere (by 2 data x 2 model ranks; the tied wte by twice as
  // many).
  CHECK(holders.size() == want.params.size());
  for (const auto& [name, n] : holders) {
    INFO(name);
    CHECK(n == (name == "transformer.wte.weight" ? 8 : 4));
  }
}

TEST_CASE("partitioned stage transfers move the same bits in half the pipe bytes",
          "[3d][pipeline][tensor_parallel]") {
  // (pipe, data, model) = (2, 1, 2): each stage's two slices send half an activation each
  // and all-gather what they receive (Note [Partitioned stage transfers]). With dropout:
  // the replicated activations must be the same on both slices, masks included.
  const parallel::ProcessGrid grid(2, 1, 2);
  const std::vector<Trace> whole = run_3d(grid, 3, false, 0.1);
  const std::vector<Trace> pieces = run_3d(grid, 3, true, 0.1);
  CHECK(run_3d(grid, 1, true, 0.0)[0].losses[0] != pieces[0].losses[0]);  // dropout acts
  for (int r = 0; r < grid.world_size(); ++r) {
    INFO("rank " << r << " (" << grid.describe(r) << ")");
    CHECK(pieces[r].losses == whole[r].losses);
    CHECK(pieces[r].norms == whole[r].norms);
    for (const auto& [name, t] : whole[r].params) {
      INFO(name);
      CHECK(pieces[r].params.at(name).to_vector<float>() == t.to_vector<float>());
    }
    // The activations and gradients (2 x 9 x 16 f32 each, 3 x 3 of each way) are most of
    // the pipe's bytes; the rest (shape headers, the loss broadcast, the tied embedding's
    // gradient sum) is unchanged.
    INFO("pipe bytes: " << pieces[r].pipe_bytes << " partitioned, " << whole[r].pipe_bytes
                        << " whole");
    const int64_t transfers = int64_t{3} * kMicro * 2 * 9 * 16 * 4;
    CHECK(whole[r].pipe_bytes - pieces[r].pipe_bytes == transfers / 2);
  }
}

}  // namespace
}  // namespace tessera
