// The 1-bit optimizers' per-rank state (parallel/compression/onebit_optimizer.h): it
// resumes every optimizer bit for bit, and state from another run is refused before
// anything changes.
#include <catch2/catch.hpp>
#include <map>
#include <mutex>
#include <vector>

#include "tests/parallel/compression/onebit_setup.h"

namespace tessera::parallel {
namespace {

using namespace onebit_testing;

TEST_CASE("the per-rank state resumes every 1-bit optimizer bit for bit", "[onebit]") {
  constexpr int kWorld = 2;
  constexpr int64_t kSteps = 26;
  OneBitOptions o;
  o.freeze_step = 4;
  o.var_freeze_step = 6;
  o.var_update_scaler = 1;
  o.local_step_scaler = 2;
  o.local_step_clipper = 4;
  for (const Kind kind : {Kind::adam, Kind::zero_one, Kind::lamb}) {
    for (const int64_t stop : {3, 10, 17}) {  // warm-up; compressed or 0/1 Adam between syncs
      INFO("optimizer " << static_cast<int>(kind) << ", stopped after step " << stop);
      std::vector<std::vector<Vec>> uninterrupted(kWorld), resumed(kWorld);
      std::vector<StateDict> shared(kWorld), per_rank(kWorld);
      std::vector<std::vector<Vec>> saved_params(kWorld);
      std::mutex mu;
      run_thread_ranks(kWorld, [&](Communicator& comm) {
        std::vector<optim::ParamGroup> groups = make_groups();
        const std::vector<Tensor> params = params_of(groups);
        std::unique_ptr<OneBitOptimizer> opt = make(kind, std::move(groups), comm, o);
        for (int64_t t = 1; t <= kSteps; ++t) {
          set_grads(params, comm.rank(), kWorld, opt->reduce_gradients_next(), t);
          opt->step();
          if (t == stop) {
            std::lock_guard<std::mutex> lock(mu);
            for (const auto& [k, v] : opt->state_dict())
              shared[comm.rank()].emplace_back(k, v.clone());
            for (const auto& [k, v] : opt->rank_state())
              per_rank[comm.rank()].emplace_back(k, v.clone());
            for (const Tensor& p : params) saved_params[comm.rank()].push_back(values(p));
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        for (const Tensor& p : params) uninterrupted[comm.rank()].push_back(values(p));
      });
      run_thread_ranks(kWorld, [&](Communicator& comm) {
        std::vector<optim::ParamGroup> groups = make_groups();
        const std::vector<Tensor> params = params_of(groups);
        std::unique_ptr<OneBitOptimizer> opt = make(kind, std::move(groups), comm, o);
        {
          // What a checkpoint holds: rank 0's weights and shared state, each rank's own state.
          NoGradGuard no_grad;
          for (size_t i = 0; i < params.size(); ++i) {
            params[i].copy_(tensor_of(saved_params[0][i], kShapes[i]));
          }
        }
        opt->load_state_dict(shared[0]);
        opt->load_rank_state(per_rank[comm.rank()]);
        for (int64_t t = stop + 1; t <= kSteps; ++t) {
          set_grads(params, comm.rank(), kWorld, opt->reduce_gradients_next(), t);
          opt->step();
        }
        std::lock_guard<std::mutex> lock(mu);
        for (const Tensor& p : params) resumed[comm.rank()].push_back(values(p));
      });
      for (int r = 0; r < kWorld; ++r) CHECK(max_diff(resumed[r], uninterrupted[r]) == 0.0);
    }
  }
}

TEST_CASE("per-rank state from another run is refused before anything changes", "[onebit]") {
  run_thread_ranks(1, [](Communicator& comm) {
    std::vector<optim::ParamGroup> groups = make_groups();
    OneBitAdam opt(std::move(groups), comm, adam_options(), onebit_options());
    StateDict state = opt.rank_state();
    REQUIRE(state.size() == 4);  // worker and server errors of the two groups
    CHECK(state[0].first == "worker_error.0");
    StateDict wrong = {{state[0].first, zeros({5})}};
    for (size_t i = 1; i < state.size(); ++i) wrong.push_back(state[i]);
    CHECK_THROWS_WITH(opt.load_rank_state(wrong),
                      Catch::Contains("per-rank state \"worker_error.0\": expected f32 (48)"));
    StateDict missing(state.begin() + 1, state.end());
    CHECK_THROWS_WITH(opt.load_rank_state(missing),
                      Catch::Contains("expected \"worker_error.0\" (saved at the same world "
                                      "size), found none"));
    StateDict extra = state;
    extra.emplace_back("momentum_accumulator", zeros({3}));
    CHECK_THROWS_WITH(opt.load_rank_state(extra),
                      Catch::Contains("unexpected per-rank state \"momentum_accumulator\""));
  });
}

}  // namespace
}  // namespace tessera::parallel
