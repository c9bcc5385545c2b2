// SwappedOptimizerState (Note [Offloaded optimizer state] in
// parallel/offload/swapped_optimizer_state.h): Adam and SGD stepped a sub-group at a time
// with their state (and the masters, where they have storages of their own, and the
// gradients, scaled in the sub-group's turn) in the swap file give the in-memory optimizer's
// bits, step after step and across a state reload; between steps nothing of the state is in
// memory, and during a sub-group's turn only it; the gradients are discarded by the step.
#include "parallel/offload/swapped_optimizer_state.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/factories.h"
#include "kernels/blas1.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

// Five f32 parameters with storages of their own (as 16-bit runs' master chunks are), in
// two groups, the same values for the same seed.
std::vector<optim::ParamGroup> groups(uint64_t seed) {
  Generator gen(seed);
  std::vector<optim::ParamGroup> out = {{{}, 1e-2, 0.1}, {{}, 1e-2, 0.0}};
  const std::vector<int64_t> sizes = {3000, 17, 1025, 1, 4096};
  for (size_t i = 0; i < sizes.size(); ++i) {
    Tensor t = randn({sizes[i]}, gen);
    t.set_requires_grad(true);
    out[i % 2].params.push_back({"chunk." + std::to_string(i), t, {}});
  }
  return out;
}

void set_grads(const std::vector<optim::ParamGroup>& gs, int step) {
  Generator gen(100 + static_cast<uint64_t>(step));
  for (const optim::ParamGroup& g : gs) {
    for (const NamedParameter& p : g.params) p.tensor.set_grad(randn(p.tensor.shape(), gen));
  }
}

std::unique_ptr<optim::Optimizer> make(bool adam, std::vector<optim::ParamGroup> gs) {
  if (adam) return std::make_unique<optim::Adam>(std::move(gs), optim::AdamOptions{});
  optim::SgdOptions o;
  o.momentum = 0.9;
  return std::make_unique<optim::Sgd>(std::move(gs), o);
}

const NamedParameter& find(const std::vector<optim::ParamGroup>& gs, const std::string& name) {
  for (const optim::ParamGroup& g : gs) {
    for (const NamedParameter& p : g.params) {
      if (p.name == name) return p;
    }
  }
  FAIL("no parameter " << name);
  throw;
}

std::vector<std::vector<float>> values(const std::vector<optim::ParamGroup>& gs) {
  std::vector<std::vector<float>> out;
  for (const optim::ParamGroup& g : gs) {
    for (const NamedParameter& p : g.params) out.push_back(p.tensor.to_vector<float>());
  }
  return out;
}

TEST_CASE("an optimizer stepped with its state swapped gives the in-memory bits", "[offload]") {
  const auto dir = testing::fresh_dir("swapped_optimizer_state");
  for (const bool adam : {true, false}) {
    for (const bool masters : {true, false}) {
      for (const bool swapped_grads : {false, true}) {
        DYNAMIC_SECTION((adam ? "Adam" : "SGD") << (masters ? ", masters swapped" : "")
                                                << (swapped_grads ? ", gradients swapped" : "")) {
          const std::vector<optim::ParamGroup> plain_groups = groups(3), swapped_groups = groups(3);
          const auto plain = make(adam, plain_groups);
          const auto swapped = make(adam, swapped_groups);
          // Sub-groups: {0, 3}, {1}, {2, 4}; some params in another group than their order.
          const std::vector<std::vector<std::string>> names = {
              {"chunk.0", "chunk.3"}, {"chunk.1"}, {"chunk.2", "chunk.4"}};
          AioConfig aio;
          aio.queue_depth = 4;
          TensorSwapper swapper((dir / "state.swp").string(), aio, 2, 8192);
          std::vector<SwappedOptimizerState::SubGroup> subs;
          std::vector<int64_t> group_bytes;
          std::vector<Tensor> grads;  // swapped ones: one storage each for the whole run
          std::vector<int64_t> grad_ids;
          for (const auto& n : names) {
            SwappedOptimizerState::SubGroup s{n, {}, {}};
            int64_t bytes = 0;
            for (const std::string& name : n) {
              const Tensor& t = find(swapped_groups, name).tensor;
              if (masters) s.storages.push_back(swapper.add(t.storage()));
              if (swapped_grads) {
                grads.push_back(zeros(t.shape()));
                t.set_grad(grads.back());
                grad_ids.push_back(swapper.add(grads.back().storage()));
                s.gradients.push_back(grad_ids.back());
              }
              bytes += static_cast<int64_t>(t.nbytes()) * ((adam ? 2 : 1) + (masters ? 1 : 0));
            }
            subs.push_back(s);
            group_bytes.push_back(bytes);
          }
          if (swapped_grads) swapper.discard(grad_ids);
          SwappedOptimizerState state(*swapped, subs, swapper);
          if (masters) CHECK(state.resident_bytes() == 0);  // the masters went out at once
          std::vector<int64_t> seen;
          for (int step = 0; step < 4; ++step) {
            set_grads(plain_groups, step);
            if (swapped_grads) {
              // Written to the file, as a reduction does, and scaled in the sub-group's turn.
              swapper.swap_in(grad_ids);  // zeros: discarded by the last step
              for (const Tensor& g : grads)
                CHECK(g.to_vector<float>() == std::vector<float>(g.numel(), 0.0f));
              set_grads(swapped_groups, step);
              size_t k = 0;
              for (const auto& n : names) {
                for (const std::string& name : n) {
                  const NamedParameter& p = find(swapped_groups, name);
                  grads[k].copy_(p.tensor.grad());
                  p.tensor.set_grad(grads[k++]);
                }
              }
              swapper.swap_out(grad_ids);
              for (const optim::ParamGroup& pg : plain_groups) {
                for (const NamedParameter& p : pg.params) kernels::scale_(p.tensor.grad(), 0.5);
              }
            } else {
              set_grads(swapped_groups, step);
            }
            plain->step();
            seen.clear();
            state.step(
                [&](size_t g) {
                  if (!swapped_grads) return;
                  for (const std::string& name : names[g]) {
                    kernels::scale_(find(swapped_groups, name).tensor.grad(), 0.5);
                  }
                },
                [&](size_t g) { seen.push_back(state.resident_bytes() - group_bytes[g]); });
            CHECK(state.resident_bytes() == 0);  // all out between steps
            for (const int64_t id : grad_ids) CHECK_FALSE(swapper.resident(id));  // discarded
            for (const int64_t other : seen) CHECK(other == 0);  // only the group's turn is in
            CHECK(swapped->step_count() == plain->step_count());
            if (step == 1) {
              // A checkpoint's round trip, a storage at a time: the state and masters read
              // where they are, then loaded back a sub-group at a time, the masters rewritten
              // whole (no read).
              const StateDict live = swapped->state_dict();
              std::vector<int64_t> ids;
              for (const auto& [k, t] : live) {
                ids.push_back(k == "step" ? -1 : state.state_id(k));
                if (k != "step") CHECK(ids.back() >= 0);
              }
              std::vector<std::string> master_names;
              std::vector<int64_t> master_ids;  // -1: in memory, not swapped
              for (size_t g = 0; g < names.size(); ++g) {
                for (size_t j = 0; j < names[g].size(); ++j) {
                  master_names.push_back(names[g][j]);
                  master_ids.push_back(masters ? subs[g].storages[j] : -1);
                }
              }
              std::map<std::string, Tensor> saved_masters;
              swapper.read_each(master_ids, [&](size_t i) {
                saved_masters[master_names[i]] =
                    find(swapped_groups, master_names[i]).tensor.clone();
              });
              StateDict saved;
              int64_t largest = 0;
              for (const int64_t id : ids)
                largest = std::max(largest, id < 0 ? 0 : swapper.bytes(id));
              swapper.read_each(ids, [&](size_t i) {
                saved.emplace_back(live[i].first, live[i].second.clone());
                CHECK(state.resident_bytes() <= 2 * largest);  // this one and the next's read
              });
              CHECK(state.resident_bytes() == 0);  // read_each let each go
              // With swapped masters, each sub-group's are written whole (not read).
              std::function<void(size_t)> fill;
              if (masters) {
                fill = [&](size_t g) {
                  for (const std::string& name : names[g]) {
                    find(swapped_groups, name).tensor.copy_(saved_masters.at(name));
                  }
                };
              }
              state.load(saved, fill, {});
              CHECK(state.resident_bytes() == 0);  // all out again
              CHECK(swapped->step_count() == plain->step_count());
            }
          }
          state.make_storages_resident();  // the masters, not the state
          CHECK(values(swapped_groups) == values(plain_groups));
          const StateDict a = plain->state_dict(), b = swapped->state_dict();
          REQUIRE(a.size() == b.size());
          std::vector<int64_t> ids;
          for (const auto& [k, t] : b) ids.push_back(k == "step" ? -1 : state.state_id(k));
          swapper.read_each(ids, [&](size_t i) {
            INFO(a[i].first);
            CHECK(a[i].first == b[i].first);
            CHECK(a[i].second.to(DType::f64).to_vector<double>() ==
                  b[i].second.to(DType::f64).to_vector<double>());
          });
        }
      }
    }
  }
}

TEST_CASE("swapped optimizer state names bad sub-groups and optimizers", "[offload]") {
  const auto dir = testing::fresh_dir("swapped_optimizer_state_errors");
  TensorSwapper swapper((dir / "s.swp").string(), AioConfig{}, 1, 4096);
  const std::vector<optim::ParamGroup> gs = groups(1);
  optim::Adam adam(gs, {});
  CHECK_THROWS_WITH(
      SwappedOptimizerState(adam, {{{"chunk.0", "chunk.1", "chunk.2", "chunk.3"}, {}}}, swapper),
      "[offload] parameter \"chunk.4\" of the optimizer is in no sub-group; "
      "expected every parameter in one");
  CHECK_THROWS_WITH(
      SwappedOptimizerState(adam, {{{"chunk.0", "chunk.0"}, {}}}, swapper),
      "[offload] sub-group parameter \"chunk.0\": expected a parameter of the optimizer in "
      "one sub-group only");
}

}  // namespace
}  // namespace tessera::parallel
