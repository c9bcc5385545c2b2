// Expert parallelism (Note [Expert parallelism] in models/moe/moe_layer.h) on thread ranks
// against the single-rank layer: each rank's output and input gradient equal those of a
// layer holding every expert run on that rank's tokens alone, and each expert's weight
// gradient on the rank holding it is the sum of the single-rank gradients over all ranks.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/moe/expert_mlp.h"
#include "models/moe/moe_layer.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/expert/all_to_all.h"

namespace tessera::moe {
namespace {

constexpr int64_t kEmbd = 6, kHidden = 8, kExperts = 4, kTokens = 10;

std::unique_ptr<MoeLayer> make_layer(const GateConfig& gate, Generator& gen,
                                     parallel::Communicator* group) {
  return std::make_unique<MoeLayer>(
      kEmbd, kExperts, gate, /*use_residual=*/false,
      [](int64_t) { return std::make_unique<ExpertMlp>(kEmbd, kHidden, true); }, gen, DType::f32,
      group);
}

// Every parameter of the full layer from (seed, name), so both layouts hold the same ones.
void init(MoeLayer& layer) {
  NoGradGuard no_grad;
  for (const NamedParameter& p : layer.named_parameters()) {
    Generator g = Generator::for_name(7, p.name);
    p.tensor.copy_(randn(p.tensor.shape(), g, {}, 0.0, 0.5));
  }
}

struct Result {
  int64_t capacity = 0;
  std::vector<float> out, x_grad;
  std::map<std::string, std::vector<float>> grads;
};

// Rank r's tokens and the loss weights.
Tensor tokens(int r) {
  Generator g(100 + static_cast<uint64_t>(r));
  return randn({kTokens, kEmbd}, g);
}
Tensor weights(int r) {
  Generator g(200 + static_cast<uint64_t>(r));
  return randn({kTokens, kEmbd}, g);
}

Result run(MoeLayer& layer, int r) {
  Tensor x = tokens(r);
  x.set_requires_grad(true);
  const MoeOutput out = layer.forward(x);
  backward(add(sum(mul(out.output, weights(r))), out.l_aux));
  Result res{out.routing.capacity, out.output.to_vector<float>(), x.grad().to_vector<float>(), {}};
  for (const NamedParameter& p : layer.named_parameters()) {
    res.grads[p.name] = p.tensor.grad().to_vector<float>();
  }
  return res;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-5));
}

TEST_CASE("expert-parallel MoE equals the single-rank layer per rank", "[moe][parallel]") {
  struct Case {
    int ranks, k;
    bool drop;
  };
  for (const Case c : {Case{2, 1, true}, Case{2, 2, true}, Case{4, 1, true}, Case{4, 2, false},
                       Case{2, 1, false}}) {
    DYNAMIC_SECTION(c.ranks << " ranks, top-" << c.k << (c.drop ? ", dropping" : ", no drops")) {
      GateConfig gate;
      gate.k = c.k;
      gate.capacity_factor = 0.5;  // drops tokens where allowed
      gate.drop_tokens = c.drop;
      gate.min_capacity = 0;
      gate.use_rts = false;
      gate.top2_2nd_expert_sampling = false;
      // The references: every expert on one rank, each rank's tokens alone.
      std::vector<Result> want;
      for (int r = 0; r < c.ranks; ++r) {
        Generator gen(1);
        const std::unique_ptr<MoeLayer> full = make_layer(gate, gen, nullptr);
        init(*full);
        want.push_back(run(*full, r));
      }
      std::vector<Result> got(static_cast<size_t>(c.ranks));
      std::vector<int64_t> first(static_cast<size_t>(c.ranks));
      parallel::run_thread_ranks(c.ranks, [&](parallel::Communicator& group) {
        Generator gen(1);
        const std::unique_ptr<MoeLayer> layer = make_layer(gate, gen, &group);
        init(*layer);
        got[static_cast<size_t>(group.rank())] = run(*layer, group.rank());
        first[static_cast<size_t>(group.rank())] = layer->first_local_expert();
      });
      // Without drops the ranks' own capacities differ here and the group takes the largest.
      int64_t largest = 0, smallest = 1 << 30;
      for (const Result& w : want)
        largest = std::max(largest, w.capacity), smallest = std::min(smallest, w.capacity);
      if (!c.drop) CHECK(smallest < largest);
      for (const Result& g : got) CHECK(g.capacity == (c.drop ? smallest : largest));
      for (int r = 0; r < c.ranks; ++r) {
        INFO("rank " << r);
        const Result& g = got[static_cast<size_t>(r)];
        const Result& w = want[static_cast<size_t>(r)];
        // Without drops the group's capacity may exceed the rank's own: only padding differs.
        check_close(g.out, w.out, "output");
        check_close(g.x_grad, w.x_grad, "input gradient");
        check_close(g.grads.at("gate.weight"), w.grads.at("gate.weight"), "gate gradient");
        CHECK(first[static_cast<size_t>(r)] == r * (kExperts / c.ranks));
        // This rank's experts: their gradients summed over every rank's tokens.
        for (const auto& [name, grad] : g.grads) {
          if (name == "gate.weight") continue;
          std::vector<float> total(grad.size(), 0.0f);
          for (const Result& each : want) {
            const std::vector<float>& part = each.grads.at(name);
            for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
          }
          check_close(grad, total, name);
        }
        CHECK(g.grads.size() == 1 + 4 * static_cast<size_t>(kExperts / c.ranks));
      }
    }
  }
}

TEST_CASE("expert parallelism's all-to-all bytes follow the formula", "[moe][parallel]") {
  // Per forward and backward, four exchanges of the E x C x C buffers, each sending (P - 1) /
  // P of them (Note [Bytes sent] in parallel/comm/communicator.h): 4 (P - 1) / P x E C C x 4
  // bytes per rank.
  GateConfig gate;
  gate.k = 2;
  gate.min_capacity = 0;
  gate.use_rts = false;
  gate.top2_2nd_expert_sampling = false;
  std::vector<int64_t> bytes(4), calls(4), capacity(4);
  parallel::run_thread_ranks(4, [&](parallel::Communicator& group) {
    Generator gen(1);
    const std::unique_ptr<MoeLayer> layer = make_layer(gate, gen, &group);
    init(*layer);
    group.reset_stats();
    const Result r = run(*layer, group.rank());
    const auto me = static_cast<size_t>(group.rank());
    bytes[me] = group.stats()[parallel::CommOp::all_to_all].bytes_sent;
    calls[me] = group.stats()[parallel::CommOp::all_to_all].calls;
    capacity[me] = r.capacity;
  });
  for (size_t r = 0; r < 4; ++r) {
    const int64_t buffer = kExperts * capacity[r] * kEmbd * 4;  // f32
    CHECK(calls[r] == 4);
    CHECK(bytes[r] == 4 * buffer * 3 / 4);
  }
}

TEST_CASE("expert parallelism refuses ranks that drop tokens at different capacities",
          "[moe][parallel]") {
  GateConfig gate;
  gate.min_capacity = 0;
  gate.use_rts = false;
  CHECK_THROWS_WITH(parallel::run_thread_ranks(
                        2,
                        [&](parallel::Communicator& group) {
                          Generator gen(1);
                          const std::unique_ptr<MoeLayer> layer = make_layer(gate, gen, &group);
                          Generator g(3);
                          // 10 and 20 tokens: capacities 3 and 5.
                          layer->forward(randn({10 * (group.rank() + 1), kEmbd}, g));
                        }),
                    Catch::Contains("found capacities 3 to 5"));
}

TEST_CASE("all_to_all_rows exchanges blocks of rows and sends gradients back", "[moe][parallel]") {
  std::vector<std::vector<float>> out(3), grad(3);
  parallel::run_thread_ranks(3, [&](parallel::Communicator& group) {
    const int r = group.rank();
    // Row j of rank r holds 10 r + j; block j (one row) goes to rank j.
    std::vector<float> rows;
    for (int j = 0; j < 3; ++j) rows.push_back(static_cast<float>(10 * r + j));
    Tensor x = from_vector(rows, {3, 1});
    x.set_requires_grad(true);
    const Tensor y = parallel::all_to_all_rows(x, group);
    backward(sum(mul(y, from_vector(std::vector<float>{1, 2, 3}, {3, 1}))));
    out[static_cast<size_t>(r)] = y.to_vector<float>();
    grad[static_cast<size_t>(r)] = x.grad().to_vector<float>();
  });
  for (int r = 0; r < 3; ++r) {
    // Row i of rank r's output came from rank i's row r.
    CHECK(out[static_cast<size_t>(r)] == std::vector<float>{static_cast<float>(r),
                                                            static_cast<float>(10 + r),
                                                            static_cast<float>(20 + r)});
    // Rank r's row j went to rank j as its row r, weighted r + 1 there.
    CHECK(grad[static_cast<size_t>(r)] == std::vector<float>(3, static_cast<float>(r + 1)));
  }
}

}  // namespace
}  // namespace tessera::moe
