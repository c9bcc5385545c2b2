// Note [A step in parts] in optim/optimizer.h: Adam, AdamW and SGD stepped one
// parameter at a time (in an order of their own, with an empty part between) through
// update_part() and finish_step() give step()'s bits, in the parameters and the state.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/factories.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/testing.h"

namespace tessera::optim {
namespace {

// Two groups of f32 parameters of a few shapes, the same values for the same seed.
std::vector<ParamGroup> groups(uint64_t seed) {
  Generator gen(seed);
  std::vector<ParamGroup> out = {{{}, 1e-2, 0.1}, {{}, 1e-2, 0.0}};
  const std::vector<Shape> shapes = {{7, 3}, {5}, {2, 2, 3}, {1}, {11}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor t = randn(shapes[i], gen);
    t.set_requires_grad(true);
    out[i % 2].params.push_back({"p" + std::to_string(i), t, {}});
  }
  return out;
}

void set_grads(const std::vector<ParamGroup>& gs, int step) {
  Generator gen(1000 + static_cast<uint64_t>(step));
  for (const ParamGroup& g : gs) {
    for (const NamedParameter& p : g.params) p.tensor.set_grad(randn(p.tensor.shape(), gen));
  }
}

std::unique_ptr<Optimizer> make(const std::string& kind, std::vector<ParamGroup> gs) {
  if (kind == "AdamW") return std::make_unique<Adam>(std::move(gs), AdamOptions{});
  if (kind == "Adam") {
    AdamOptions o;
    o.adam_w_mode = false;
    return std::make_unique<Adam>(std::move(gs), o);
  }
  SgdOptions o;  // "SGD"
  o.momentum = 0.9;
  o.nesterov = true;
  return std::make_unique<Sgd>(std::move(gs), o);
}

TEST_CASE("a step in parts gives step()'s bits", "[optim]") {
  for (const std::string kind : {"AdamW", "Adam", "SGD"}) {
    DYNAMIC_SECTION(kind) {
      const std::vector<ParamGroup> whole_groups = groups(5), part_groups = groups(5);
      const auto whole = make(kind, whole_groups);
      const auto parts = make(kind, part_groups);
      REQUIRE(parts->supports_parts());
      std::vector<std::string> names;
      for (const ParamGroup& g : part_groups) {
        for (const NamedParameter& p : g.params) names.push_back(p.name);
      }
      for (int step = 0; step < 3; ++step) {
        set_grads(whole_groups, step);
        set_grads(part_groups, step);
        whole->step();
        for (auto it = names.rbegin(); it != names.rend(); ++it) {
          parts->update_part([&](const NamedParameter& p) { return p.name == *it; });
          parts->update_part([](const NamedParameter&) { return false; });
        }
        parts->finish_step();
      }
      CHECK(parts->step_count() == whole->step_count());
      const StateDict a = whole->state_dict(), b = parts->state_dict();
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        CHECK(a[i].first == b[i].first);
        CHECK(a[i].second.to_vector<float>() == b[i].second.to_vector<float>());
      }
      for (size_t g = 0; g < whole_groups.size(); ++g) {
        for (size_t i = 0; i < whole_groups[g].params.size(); ++i) {
          CHECK(whole_groups[g].params[i].tensor.to_vector<float>() ==
                part_groups[g].params[i].tensor.to_vector<float>());
        }
      }
    }
  }
}

// An optimizer whose step couples its parameters refuses parts.
class Coupled final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  void step() override { advance(); }
  std::string name() const override { return "Coupled"; }

 protected:
  std::vector<std::string> state_names() const override { return {}; }
};

TEST_CASE("an optimizer that steps all its parameters together refuses parts", "[optim]") {
  Coupled opt(groups(1));
  CHECK(!opt.supports_parts());
  CHECK_THROWS_WITH(opt.update_part([](const NamedParameter&) { return true; }),
                    "[optimizer] Coupled does not step in parts; expected an optimizer that "
                    "does (Adam, AdamW, SGD)");
}

}  // namespace
}  // namespace tessera::optim
