// GPT's batch-split blocks (Note [Batch-split overlap] in models/gpt2/batch_split.h) on two
// thread ranks of a model group behind a slow simulated link, so that every piece's sum is
// still travelling when the next piece computes: a piece that read its sum before it
// arrived would see a partial product. Against the same model with whole micro-batches:
// logits and loss the same bits (with dropout on the blocks' outputs and the attention
// probabilities, whose masks are the same), gradients within 1e-6 relative (each weight's
// gradient is a sum of the pieces' products). Also with uneven pieces, more pieces than
// sequences, activation checkpointing and progressive layer drop, and the refusals.
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
#include "tests/testing.h"
#include "tests/tiny_gpt.h"

namespace tessera {
namespace {

constexpr double kTol = 1e-6;
constexpr uint64_t kSeed = 7;

// tiny_gpt_config's model with 3 blocks.
GptConfig config(double dropout) {
  GptConfig c = testing::tiny_gpt_config(96);
  c.n_layer = 3;
  c.dropout = dropout;
  c.attention_dropout = dropout;
  return c;
}

// (B, 16) token ids and targets.
std::pair<Tensor, Tensor> batch(int64_t b) {
  std::vector<int64_t> x(static_cast<size_t>(b * 16)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = philox4x32(i, 0, 11)[0] % 96;
    y[i] = philox4x32(i, 0, 12)[0] % 96;
  }
  return {from_vector(x, {b, 16}), from_vector(y, {b, 16})};
}

// One rank's forward and backward.
struct Result {
  std::vector<float> logits;
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

struct Setup {
  double dropout = 0.0;
  int64_t batch = 4;
  int64_t checkpoint_interval = 0;
  double layer_drop_theta = 0.0;  // 0: off
};

// Rank by rank: the model with whole micro-batches (pieces 1) and with `pieces`.
std::vector<std::map<int64_t, Result>> run(const Setup& s, int64_t pieces) {
  std::vector<std::map<int64_t, Result>> got(2);
  std::mutex mutex;
  parallel::run_thread_ranks(2, [&](parallel::Communicator& group) {
    group.set_simulated_link({.gbit_per_s = 0.5, .latency_us = 500});
    for (const int64_t n : {int64_t{1}, pieces}) {
      Gpt model(config(s.dropout), kSeed, &group);
      model.set_batch_split(n);
      model.set_activation_checkpointing(s.checkpoint_interval);
      if (s.layer_drop_theta > 0) model.set_layer_drop(s.layer_drop_theta, 3);
      model.train();
      const auto [x, y] = batch(s.batch);
      const Tensor logits = model.forward(x);
      const Tensor loss = model.loss(logits, y);
      Result r;
      r.logits = logits.to_vector<float>();
      r.loss = loss.item<float>();
      backward(loss);
      model.wait_for_communication();
      for (const NamedParameter& p : model.named_parameters()) {
        r.grads[p.name] = p.tensor.grad().to_vector<float>();
      }
      std::lock_guard<std::mutex> lock(mutex);
      got[group.rank()][n] = std::move(r);
    }
  });
  return got;
}

void check_equal(const std::vector<std::map<int64_t, Result>>& got, int64_t pieces) {
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const Result& whole = got[r].at(1);
    const Result& split = got[r].at(pieces);
    CHECK(split.logits == whole.logits);
    CHECK(split.loss == whole.loss);
    REQUIRE(split.grads.size() == whole.grads.size());
    for (const auto& [name, grad] : whole.grads) {
      INFO(name);
      CHECK(testing::relative_l2_error(split.grads.at(name), grad) <= kTol);
    }
  }
}

TEST_CASE("batch-split blocks compute the whole micro-batch's logits, loss and gradients",
          "[tensor_parallel][gpt]") {
  SECTION("2 pieces of 2 sequences, dropout on outputs and attention probabilities") {
    check_equal(run({.dropout = 0.1}, 2), 2);
  }
  SECTION("3 uneven pieces (2, 1, 1)") { check_equal(run({}, 3), 3); }
  SECTION("more pieces than sequences: one per sequence") {
    check_equal(run({.dropout = 0.1, .batch = 2}, 4), 4);
  }
  SECTION("with activation checkpointing every 2 blocks") {
    check_equal(run({.dropout = 0.1, .checkpoint_interval = 2}, 2), 2);
  }
  SECTION("with progressive layer drop") { check_equal(run({.layer_drop_theta = 0.5}, 2), 2); }
}

TEST_CASE("batch split needs tensor slicing with overlapped sums and dense blocks",
          "[tensor_parallel][gpt]") {
  Gpt alone(config(0.0), kSeed);
  CHECK_NOTHROW(alone.set_batch_split(1));
  CHECK_THROWS_WITH(alone.set_batch_split(2),
                    Catch::Contains("[gpt2] batch split into 2 pieces overlaps tensor-parallel "
                                    "sums; expected a model group of several ranks with "
                                    "overlap_comm and no MoE blocks, found a group of 1 without "
                                    "overlap_comm"));
  CHECK_THROWS_WITH(alone.set_batch_split(0), Catch::Contains("expected at least 1 piece"));
  CHECK_THROWS_WITH(parallel::run_thread_ranks(2,
                                               [&](parallel::Communicator& group) {
                                                 Gpt blocking(config(0.0), kSeed, &group, {},
                                                              false);
                                                 blocking.set_batch_split(2);
                                               }),
                    Catch::Contains("found a group of 2 without overlap_comm"));
}

}  // namespace
}  // namespace tessera
