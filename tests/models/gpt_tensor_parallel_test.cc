// GPT with tensor slicing (Note [Tensor-parallel GPT] in models/gpt2/gpt.h) at model-parallel
// sizes 2 and 4 on thread ranks against the dense model: each rank's initial weights are
// its slices of the dense ones, its logits the dense logits' vocabulary slice, its loss the
// dense loss, and every parameter gradient the slice of the dense gradient, within 1e-6
// relative, with and without dropout on the replicated activations (embeddings, attention
// and MLP outputs), whose masks are the dense model's; the attention probabilities' masks
// are each rank's own (tests/models/gpt_attention_dropout_test.cc). Odd sizes: vocab 101 padded to
// 128 (the last rank holds most of the padding), T = 17.
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
#include "parallel/tensor/mappings.h"
#include "tests/testing.h"

namespace tessera {
namespace {

constexpr double kTol = 1e-6;
constexpr uint64_t kSeed = 99;

GptConfig config(double dropout) {
  GptConfig c;
  c.vocab_size = 101;
  c.block_size = 17;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.dropout = dropout;
  c.attention_dropout = 0.0;
  return c;
}

std::pair<Tensor, Tensor> batch() {
  std::vector<int64_t> x(2 * 17), y(2 * 17);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = philox4x32(i, 0, 5)[0] % 101;
    y[i] = philox4x32(i, 0, 6)[0] % 101;
  }
  return {from_vector(x, {2, 17}), from_vector(y, {2, 17})};
}

// One rank's view after a forward and backward.
struct Result {
  std::vector<float> logits;
  float loss = 0;
  std::map<std::string, std::vector<float>> weights, grads;
  std::map<std::string, Placement> placements;
};

Result run(Gpt& model) {
  const auto [x, y] = batch();
  model.train();
  const Tensor logits = model.forward(x);
  const Tensor loss = model.loss(logits, y);
  Result r;
  r.logits = logits.to_vector<float>();
  r.loss = loss.item<float>();
  for (const NamedParameter& p : model.named_parameters()) {
    r.weights[p.name] = p.tensor.to_vector<float>();
    r.placements[p.name] = p.placement;
  }
  backward(loss);
  for (const NamedParameter& p : model.named_parameters()) {
    r.grads[p.name] = p.tensor.grad().to_vector<float>();
  }
  return r;
}

TEST_CASE("tensor-parallel GPT equals the dense GPT: weights, logits, loss, gradients",
          "[tensor_parallel][gpt]") {
  for (double dropout : {0.0, 0.1}) {
    Gpt reference(config(dropout), kSeed);
    const Result want = run(reference);
    std::map<std::string, Tensor> dense_weight, dense_grad;
    for (const NamedParameter& p : reference.named_parameters()) {
      dense_weight[p.name] = p.tensor.detach();
      dense_grad[p.name] = p.tensor.grad();
    }
    const Tensor want_logits = from_vector(want.logits, {2, 17, 128});
    for (int size : {2, 4}) {
      DYNAMIC_SECTION("dropout " << dropout << ", tensor-parallel size " << size) {
        std::vector<Result> got(size);
        std::mutex mutex;
        parallel::run_thread_ranks(size, [&](parallel::Communicator& group) {
          Gpt model(config(dropout), kSeed, &group);
          Result r = run(model);
          std::lock_guard<std::mutex> lock(mutex);
          got[group.rank()] = std::move(r);
        });
        for (int r = 0; r < size; ++r) {
          INFO("rank " << r);
          CHECK(std::abs(got[r].loss - want.loss) <= kTol * std::abs(want.loss));
          CHECK(
              testing::relative_l2_error(
                  got[r].logits,
                  parallel::model_parallel_slice(want_logits, -1, 1, r, size).to_vector<float>()) <=
              kTol);
          REQUIRE(got[r].grads.size() == dense_grad.size());
          for (const auto& [name, placement] : got[r].placements) {
            INFO(name);
            auto slice = [&, &placement = placement](const Tensor& full) {
              return placement.kind == Placement::Kind::sharded
                         ? parallel::model_parallel_slice(full, placement.dim, placement.parts, r,
                                                          size)
                         : full;
            };
            CHECK(got[r].weights[name] == slice(dense_weight.at(name)).to_vector<float>());
            CHECK(testing::relative_l2_error(
                      got[r].grads[name], slice(dense_grad.at(name)).to_vector<float>()) <= kTol);
          }
        }
      }
    }
  }
}

// Note [Overlapped input gradients] in parallel/tensor/layers.h: behind a slow link, so that
// each sum is still travelling while the weight gradient is computed; a gradient read
// before its sum arrived would differ.
TEST_CASE("overlapped input-gradient sums give the blocking gradients' bits",
          "[tensor_parallel][gpt]") {
  std::vector<std::map<bool, Result>> got(2);
  std::mutex mutex;
  parallel::run_thread_ranks(2, [&](parallel::Communicator& group) {
    group.set_simulated_link({.gbit_per_s = 1.0, .latency_us = 200});
    for (const bool overlap : {false, true}) {
      Gpt model(config(0.0), kSeed, &group, {}, overlap);
      Result r = run(model);
      std::lock_guard<std::mutex> lock(mutex);
      got[group.rank()][overlap] = std::move(r);
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(got[r][true].loss == got[r][false].loss);
    CHECK(got[r][true].grads == got[r][false].grads);
  }
}

TEST_CASE("tensor-parallel GPT refuses sizes that do not split", "[tensor_parallel][gpt]") {
  GptConfig c = config(0.0);
  c.n_head = 3;
  c.n_embd = 24;
  CHECK_THROWS_WITH(parallel::run_thread_ranks(
                        2, [&](parallel::Communicator& group) { Gpt model(c, kSeed, &group); }),
                    Catch::Contains("[gpt2] n_head 3 does not split over a tensor-parallel group "
                                    "of 2; expected a multiple of 2"));
  CHECK_THROWS_WITH(parallel::run_thread_ranks(3,
                                               [&](parallel::Communicator& group) {
                                                 GptConfig d = config(0.0);
                                                 d.n_head = 3;
                                                 d.n_embd = 24;
                                                 Gpt model(d, kSeed, &group);
                                               }),
                    Catch::Contains("num_embeddings 128 does not split over a model-parallel "
                                    "group of 3"));
}

}  // namespace
}  // namespace tessera
