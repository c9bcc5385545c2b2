// Tensor-parallel layers and the vocab-parallel cross-entropy at model-parallel sizes 1, 2
// and 4 (thread ranks) against the dense ops on the full tensors: outputs, input gradients
// and weight gradients within 1e-6 relative (f32). Each rank loads its slice of the dense
// parameters with model_parallel_slice and backpropagates the same upstream gradient.
#include "parallel/tensor/layers.h"

#include <catch2/catch.hpp>
#include <functional>
#include <mutex>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/tensor/cross_entropy.h"
#include "parallel/tensor/mappings.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

constexpr double kTol = 1e-6;
const int kSizes[] = {1, 2, 4};

Tensor leaf(const Tensor& t) {
  Tensor x = t.clone();
  x.set_requires_grad(true);
  return x;
}

// What one rank computed, kept for the main thread's checks.
struct RankResult {
  std::vector<float> y, dx, dw, db;
};

// Runs fn on `size` thread ranks and returns each rank's result.
std::vector<RankResult> on_ranks(int size, const std::function<RankResult(Communicator&)>& fn) {
  std::vector<RankResult> out(size);
  std::mutex mutex;
  run_thread_ranks(size, [&](Communicator& group) {
    RankResult r = fn(group);
    std::lock_guard<std::mutex> lock(mutex);
    out[group.rank()] = std::move(r);
  });
  return out;
}

void check_close(const std::vector<float>& got, const Tensor& want, const char* what) {
  INFO(what);
  REQUIRE(got.size() == static_cast<size_t>(want.numel()));
  CHECK(testing::relative_l2_error(got, want.to_vector<float>()) <= kTol);
}

// sum(y * g): a loss whose gradient with respect to y is g.
Tensor dot(const Tensor& y, const Tensor& g) { return sum(mul(y, g)); }

TEST_CASE("ColumnParallelLinear equals the dense linear", "[tensor_parallel]") {
  Generator gen(1);
  for (int64_t parts : {1, 3}) {
    const int64_t in = 8, out = 12 * parts;
    const Tensor W = randn({out, in}, gen), b = randn({out}, gen);
    const Tensor x = randn({2, 3, in}, gen), G = randn({2, 3, out}, gen);
    // Dense reference.
    const Tensor xd = leaf(x), Wd = leaf(W), bd = leaf(b);
    const Tensor yd = linear(xd, Wd, bd);
    backward(dot(yd, G));
    for (int size : kSizes) {
      for (bool gather : {false, true}) {
        DYNAMIC_SECTION("parts " << parts << ", size " << size << ", gather " << gather) {
          const std::vector<RankResult> got = on_ranks(size, [&](Communicator& group) {
            ColumnParallelLinear layer(in, out, true, group, gather, parts);
            const int r = group.rank();
            layer.named_parameters()[0].tensor.copy_(model_parallel_slice(W, 0, parts, r, size));
            layer.named_parameters()[1].tensor.copy_(model_parallel_slice(b, 0, parts, r, size));
            const Tensor xr = leaf(x);
            const Tensor y = layer(xr);
            backward(dot(y, gather ? G : model_parallel_slice(G, -1, parts, r, size)));
            return RankResult{y.to_vector<float>(), xr.grad().to_vector<float>(),
                              layer.named_parameters()[0].tensor.grad().to_vector<float>(),
                              layer.named_parameters()[1].tensor.grad().to_vector<float>()};
          });
          for (int r = 0; r < size; ++r) {
            INFO("rank " << r);
            check_close(got[r].y,
                        gather ? yd.detach() : model_parallel_slice(yd, -1, parts, r, size), "y");
            check_close(got[r].dx, xd.grad(), "input gradient");
            check_close(got[r].dw, model_parallel_slice(Wd.grad(), 0, parts, r, size),
                        "weight gradient");
            check_close(got[r].db, model_parallel_slice(bd.grad(), 0, parts, r, size),
                        "bias gradient");
          }
        }
      }
    }
  }
}

TEST_CASE("RowParallelLinear equals the dense linear", "[tensor_parallel]") {
  Generator gen(2);
  const int64_t in = 12, out = 6;
  const Tensor W = randn({out, in}, gen), b = randn({out}, gen);
  const Tensor x = randn({2, 3, in}, gen), G = randn({2, 3, out}, gen);
  const Tensor xd = leaf(x), Wd = leaf(W), bd = leaf(b);
  const Tensor yd = linear(xd, Wd, bd);
  backward(dot(yd, G));
  for (int size : kSizes) {
    for (bool parallel_input : {false, true}) {
      DYNAMIC_SECTION("size " << size << ", input is parallel " << parallel_input) {
        const std::vector<RankResult> got = on_ranks(size, [&](Communicator& group) {
          RowParallelLinear layer(in, out, true, group, parallel_input);
          const int r = group.rank();
          layer.named_parameters()[0].tensor.copy_(model_parallel_slice(W, 1, 1, r, size));
          layer.named_parameters()[1].tensor.copy_(b);
          const Tensor xr = leaf(parallel_input ? model_parallel_slice(x, -1, 1, r, size) : x);
          const Tensor y = layer(xr);
          backward(dot(y, G));
          return RankResult{y.to_vector<float>(), xr.grad().to_vector<float>(),
                            layer.named_parameters()[0].tensor.grad().to_vector<float>(),
                            layer.named_parameters()[1].tensor.grad().to_vector<float>()};
        });
        for (int r = 0; r < size; ++r) {
          INFO("rank " << r);
          check_close(got[r].y, yd.detach(), "y");
          check_close(got[r].dx,
                      parallel_input ? model_parallel_slice(xd.grad(), -1, 1, r, size) : xd.grad(),
                      "input gradient");
          check_close(got[r].dw, model_parallel_slice(Wd.grad(), 1, 1, r, size), "weight gradient");
          check_close(got[r].db, bd.grad(), "bias gradient");
        }
      }
    }
  }
}

TEST_CASE("VocabParallelEmbedding equals the dense embedding", "[tensor_parallel]") {
  Generator gen(3);
  const int64_t vocab = 16, dim = 5;
  const Tensor W = randn({vocab, dim}, gen);
  std::vector<int64_t> id_values;
  for (int i = 0; i < 14; ++i) id_values.push_back((i * 7 + 3) % vocab);
  id_values.push_back(3);  // a repeated id accumulates twice
  const Tensor ids = from_vector(id_values, {3, 5});
  const Tensor G = randn({3, 5, dim}, gen);
  const Tensor Wd = leaf(W);
  const Tensor yd = embedding(Wd, ids);
  backward(dot(yd, G));
  for (int size : kSizes) {
    DYNAMIC_SECTION("size " << size) {
      const std::vector<RankResult> got = on_ranks(size, [&](Communicator& group) {
        VocabParallelEmbedding layer(vocab, dim, group);
        layer.named_parameters()[0].tensor.copy_(model_parallel_slice(W, 0, 1, group.rank(), size));
        const Tensor y = layer(ids);
        backward(dot(y, G));
        return RankResult{y.to_vector<float>(),
                          {},
                          layer.named_parameters()[0].tensor.grad().to_vector<float>(),
                          {}};
      });
      for (int r = 0; r < size; ++r) {
        INFO("rank " << r);
        check_close(got[r].y, yd.detach(), "y");
        check_close(got[r].dw, model_parallel_slice(Wd.grad(), 0, 1, r, size), "weight gradient");
      }
    }
  }
}

TEST_CASE("vocab_parallel_cross_entropy equals the dense loss on the real columns",
          "[tensor_parallel]") {
  Generator gen(4);
  const int64_t rows = 9, padded = 16, vocab = 13;  // 3 padding columns, all on the last rank
  const Tensor logits = randn({rows, padded}, gen, {}, 0.0, 3.0);
  // Targets in every rank's range, the last real id, and two ignored rows.
  const Tensor targets = from_vector(std::vector<int64_t>{0, 5, 12, -100, 7, 3, 11, -100, 9});
  const Tensor ld = leaf(logits);
  const Tensor dense = cross_entropy(narrow(ld, 1, 0, vocab), targets);
  backward(dense);
  for (int size : kSizes) {
    DYNAMIC_SECTION("size " << size) {
      const std::vector<RankResult> got = on_ranks(size, [&](Communicator& group) {
        const Tensor lr = leaf(model_parallel_slice(logits, 1, 1, group.rank(), size));
        const Tensor loss = vocab_parallel_cross_entropy(lr, targets, vocab, group);
        backward(loss);
        return RankResult{loss.to_vector<float>(), lr.grad().to_vector<float>(), {}, {}};
      });
      for (int r = 0; r < size; ++r) {
        INFO("rank " << r);
        check_close(got[r].y, dense.detach().view({1}), "loss");
        check_close(got[r].dx, model_parallel_slice(ld.grad(), 1, 1, r, size), "logit gradient");
      }
    }
  }
  CHECK_THROWS_WITH(
      run_thread_ranks(2,
                       [&](Communicator& group) {
                         vocab_parallel_cross_entropy(
                             model_parallel_slice(logits, 1, 1, group.rank(), 2),
                             from_vector(std::vector<int64_t>{13, 0, 0, 0, 0, 0, 0, 0, 0}), vocab,
                             group);
                       }),
      Catch::Contains("target 13 of row 0 is outside [0, 13)"));
}

TEST_CASE("gather_model_parallel_slices reassembles model_parallel_slice", "[tensor_parallel]") {
  Generator gen(5);
  const Tensor full = randn({12, 24}, gen);
  for (int size : kSizes) {
    for (int64_t dim : {0, 1}) {
      for (int64_t parts : {1, 3}) {
        DYNAMIC_SECTION("size " << size << ", dim " << dim << ", parts " << parts) {
          std::vector<RankResult> got = on_ranks(size, [&](Communicator& group) {
            const Placement p{Placement::Kind::sharded, dim, parts};
            const Tensor slice = model_parallel_slice(full, dim, parts, group.rank(), size);
            return RankResult{
                gather_model_parallel_slices(slice, p, group).to_vector<float>(), {}, {}, {}};
          });
          for (int r = 0; r < size; ++r) CHECK(got[r].y == full.to_vector<float>());
        }
      }
    }
  }
}

TEST_CASE("tensor-parallel sizes that do not divide are clear errors", "[tensor_parallel]") {
  run_thread_ranks(4, [](Communicator& group) {
    if (group.rank() != 0) return;
    // Construction only: no collective runs.
    CHECK_THROWS_WITH(ColumnParallelLinear(8, 6, true, group),
                      Catch::Contains("[ColumnParallelLinear] out_features 6 does not split over a "
                                      "model-parallel group of 4; expected a multiple of 4"));
    CHECK_THROWS_WITH(ColumnParallelLinear(8, 18, true, group, false, 3),
                      Catch::Contains("out_features 18 does not split over a model-parallel "
                                      "group of 4 in 3 blocks; expected a multiple of 12"));
    CHECK_THROWS_WITH(RowParallelLinear(10, 8, true, group),
                      Catch::Contains("[RowParallelLinear] in_features 10 does not split"));
    CHECK_THROWS_WITH(VocabParallelEmbedding(50, 8, group),
                      Catch::Contains("[VocabParallelEmbedding] num_embeddings 50 does not split"));
  });
  CHECK_THROWS_WITH(model_parallel_slice(zeros({10, 3}), 0, 3, 0, 2),
                    Catch::Contains("dim 0 of shape (10, 3) does not split into 3 x 2 equal "
                                    "pieces; expected a multiple of 6"));
}

}  // namespace
}  // namespace tessera::parallel
