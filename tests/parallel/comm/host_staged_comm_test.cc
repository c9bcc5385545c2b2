// host_staged (Note [Host-staged communication]) on thread ranks with host tensors: every
// operation and split gives what the inner group gives, the wrapper counts its own
// operations, and an inner failure surfaces with the inner group's message. Device tensors
// are tested in tests/gpu/host_staged_gpu_test.cc.
#include "parallel/comm/host_staged_comm.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/factories.h"
#include "parallel/comm/thread_comm.h"

namespace tessera::parallel {
namespace {

// Rank r's values r * 100 + i, i < n.
Tensor rank_values(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(r * 100 + i);
  return from_vector(v, {n});
}

TEST_CASE("a host-staged group gives its inner group's results", "[comm]") {
  constexpr int kWorld = 3;
  constexpr int64_t kN = 4;
  std::vector<std::string> problems(kWorld);
  run_thread_ranks(kWorld, [&](Communicator& inner) {
    const int r = inner.rank();
    std::string& bad = problems[static_cast<size_t>(r)];
    std::unique_ptr<Communicator> staged = host_staged(inner);
    if (staged->rank() != r || staged->size() != kWorld || staged->name() != inner.name()) {
      bad += "identity; ";
    }
    // Each operation twice, through the wrapper and directly, on equal inputs.
    auto same = [&](const char* what, const Tensor& a, const Tensor& b) {
      if (a.to_vector<float>() != b.to_vector<float>()) bad += std::string(what) + "; ";
    };
    Tensor a = rank_values(r, kN), b = rank_values(r, kN);
    staged->all_reduce(a);
    inner.all_reduce(b);
    same("all_reduce", a, b);
    Tensor rs_a = empty({kN}), rs_b = empty({kN});
    staged->reduce_scatter(rank_values(r, kWorld * kN), rs_a, ReduceOp::max);
    inner.reduce_scatter(rank_values(r, kWorld * kN), rs_b, ReduceOp::max);
    same("reduce_scatter", rs_a, rs_b);
    Tensor ag_a = empty({kWorld * kN}), ag_b = empty({kWorld * kN});
    staged->all_gather(rank_values(r, kN), ag_a);
    inner.all_gather(rank_values(r, kN), ag_b);
    same("all_gather", ag_a, ag_b);
    Tensor aa_a = empty({kWorld * kN}), aa_b = empty({kWorld * kN});
    staged->all_to_all(rank_values(r, kWorld * kN), aa_a);
    inner.all_to_all(rank_values(r, kWorld * kN), aa_b);
    same("all_to_all", aa_a, aa_b);
    a = rank_values(r, kN);
    staged->broadcast(a, 2);
    same("broadcast", a, rank_values(2, kN));
    const Tensor got = empty({kN});
    if (r == 0) staged->send(rank_values(0, kN), 1);
    if (r == 1) {
      staged->recv(got, 0);
      same("recv", got, rank_values(0, kN));
    }
    staged->barrier();
    // Ranks 0 and 2 form a group; rank 1 joins none.
    std::unique_ptr<Communicator> pair = staged->split(r == 1 ? -1 : 0, r);
    if ((pair == nullptr) != (r == 1)) bad += "split membership; ";
    if (pair) {
      Tensor one = full({1}, 1.0);
      pair->all_reduce(one);
      same("split all_reduce", one, full({1}, 2.0));
    }
    if (staged->stats()[CommOp::all_reduce].calls != 1) bad += "own all_reduce count; ";
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    CHECK(problems[static_cast<size_t>(r)] == "");
  }
}

TEST_CASE("a host-staged group reports its inner group's errors", "[comm]") {
  std::vector<std::string> errors(2);
  CommOptions quick;
  quick.timeout = std::chrono::milliseconds(500);
  run_thread_ranks(
      2,
      [&](Communicator& inner) {
        std::unique_ptr<Communicator> staged = host_staged(inner);
        if (inner.rank() == 1) return;  // never joins
        try {
          staged->all_reduce(zeros({3}));
        } catch (const Error& e) {
          errors[0] = e.what();
        }
      },
      quick);
  CHECK_THAT(errors[0], Catch::Contains("all_reduce #0") && Catch::Contains("timed out"));
}

}  // namespace
}  // namespace tessera::parallel
