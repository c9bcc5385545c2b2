// GPT through the pipeline executor at 2 and 4 stages with P and 2P + 1 micro-batches,
// against the same model without a pipeline accumulating the same micro-batches: the mean
// loss and every parameter's gradient (both copies of the tied wte after ReduceTiedGrads,
// which the schedule runs through the executor's hooks) within 1e-5 relative. Stages are built from
// DeepSpeed's "parameters" partition.
#include <catch2/catch.hpp>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/factories.h"
#include "core/philox.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/engine/model_stage.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "tests/testing.h"

namespace tessera {
namespace {

constexpr double kTol = 1e-5;
constexpr uint64_t kSeed = 7;

GptConfig config() {
  GptConfig c;
  c.vocab_size = 61;
  c.block_size = 11;
  c.n_layer = 5;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.0;
  return c;
}

std::vector<parallel::pipeline::MicroBatch> micro_batches(int m) {
  std::vector<parallel::pipeline::MicroBatch> out;
  for (int k = 0; k < m; ++k) {
    std::vector<int64_t> x(2 * 11), y(2 * 11);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = philox4x32(i, k, 1)[0] % 61;
      y[i] = philox4x32(i, k, 2)[0] % 61;
    }
    out.push_back({from_vector(x, {2, 11}), from_vector(y, {2, 11})});
  }
  return out;
}

using Grads = std::map<std::string, std::vector<float>>;

TEST_CASE("a pipelined GPT equals gradient accumulation without a pipeline", "[pipeline][gpt]") {
  for (int stages : {2, 4}) {
    for (int m : {stages, 2 * stages + 1}) {
      DYNAMIC_SECTION(stages << " stages, " << m << " micro-batches") {
        const auto batches = micro_batches(m);
        // The reference: every micro-batch's loss / M backpropagated into one whole model.
        Gpt whole(config(), kSeed);
        double want_loss = 0.0;
        for (const auto& mb : batches) {
          const Tensor loss = whole.loss(whole.forward(mb.inputs), mb.labels);
          want_loss += loss.item<double>() / m;
          backward(loss, scalar_tensor(1.0 / m));
        }
        Grads want;
        for (const NamedParameter& p : whole.named_parameters()) {
          want[p.name] = p.tensor.grad().to_vector<float>();
        }

        const std::vector<int> parts =
            parallel::pipeline::partition_layers(pipeline_layers(config()), stages, "parameters");
        std::vector<Grads> got(stages);
        std::vector<double> losses(stages);
        std::mutex mutex;
        parallel::run_thread_ranks(stages, [&](parallel::Communicator& pipe) {
          Gpt model(config(), kSeed, nullptr, part_of_stage(config(), parts, pipe.rank()));
          parallel::ModelStage stage(model);
          parallel::pipeline::PipelineExecutor executor(pipe, stage);
          const std::unique_ptr<parallel::Communicator> tied =
              parallel::tied_stage_group(model, pipe);
          // The schedule's closing instructions run the hooks, once each, in DeepSpeed's
          // order: the tied sum here, the others only recorded.
          std::vector<std::string> calls;
          parallel::pipeline::StepHooks hooks;
          hooks.reduce_tied_grads = [&] {
            calls.push_back("ReduceTiedGrads");
            if (tied) parallel::reduce_tied_gradients(model, *tied);
          };
          hooks.reduce_grads = [&] { calls.push_back("ReduceGrads"); };
          hooks.optimizer_step = [&] { calls.push_back("OptimizerStep"); };
          const double loss = executor.train_batch(batches, hooks);
          CHECK(calls ==
                std::vector<std::string>{"ReduceTiedGrads", "ReduceGrads", "OptimizerStep"});
          Grads g;
          for (const NamedParameter& p : model.named_parameters()) {
            g[p.name] = p.tensor.grad().to_vector<float>();
          }
          std::lock_guard<std::mutex> lock(mutex);
          got[pipe.rank()] = std::move(g);
          losses[pipe.rank()] = loss;
        });
        std::map<std::string, int> seen;
        for (int s = 0; s < stages; ++s) {
          INFO("stage " << s);
          CHECK(std::abs(losses[s] - want_loss) <= kTol * want_loss);
          for (const auto& [name, g] : got[s]) {
            INFO(name);
            REQUIRE(want.count(name) == 1);
            CHECK(testing::relative_l2_error(g, want.at(name)) <= kTol);
            ++seen[name];
          }
        }
        // Every parameter lives on exactly one stage, except the tied wte on two.
        CHECK(seen.size() == want.size());
        for (const auto& [name, count] : seen) {
          INFO(name);
          CHECK(count == (name == "transformer.wte.weight" ? 2 : 1));
        }
      }
    }
  }
}

TEST_CASE("pipeline stages of a partition and their errors", "[pipeline][gpt]") {
  const GptConfig c = config();  // 5 blocks: 8 layers
  const std::vector<int> parts = {0, 2, 5, 8};
  CHECK(part_of_stage(c, parts, 0).describe(c) == "embedding, block 0");
  CHECK(part_of_stage(c, parts, 1).describe(c) == "blocks 1-3");
  CHECK(part_of_stage(c, parts, 2).describe(c) == "block 4, final norm, LM head");
  CHECK_THROWS_WITH(part_of_stage(c, {0, 4, 4, 8}, 1),
                    Catch::Contains("pipeline stage 1 holds no layer"));
  Gpt middle(c, kSeed, nullptr, part_of_stage(c, parts, 1));
  CHECK_THROWS_WITH(middle.forward(zeros({1, 3}, {DType::i64})),
                    Catch::Contains("[gpt2] forward needs the whole model (use forward_stage); "
                                    "this pipeline stage holds blocks 1-3"));
  CHECK_THROWS_WITH(middle.loss(zeros({1, 3, 128}), zeros({1, 3}, {DType::i64})),
                    Catch::Contains("the loss needs the LM head"));
  // The stage's parameters carry their model-wide names and the whole model's values.
  Gpt whole(c, kSeed);
  std::map<std::string, std::vector<float>> values;
  for (const NamedParameter& p : whole.named_parameters())
    values[p.name] = p.tensor.to_vector<float>();
  const std::vector<NamedParameter> mine = middle.named_parameters();
  REQUIRE_FALSE(mine.empty());
  CHECK(mine.front().name.rfind("transformer.h.1.", 0) == 0);
  for (const NamedParameter& p : mine) {
    INFO(p.name);
    CHECK(p.tensor.to_vector<float>() == values.at(p.name));
  }
}

}  // namespace
}  // namespace tessera
