// await_gradient (Note [Deferred gradient waits] in autograd/gradient_wait.h): the wait a
// consumer registers runs before the gradient goes on, and only once nothing else of
// backward is ready, whatever the creation order would have run first.
#include "autograd/gradient_wait.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "autograd/backward_observer.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

// The names of the nodes backward runs, in order.
class Order final : public BackwardObserver {
 public:
  void begin(const Node& node) override { names.push_back(node.name()); }
  void end(const Node&) noexcept override {}
  std::vector<std::string> names;
};

Tensor leaf(const std::vector<float>& values, const Shape& shape) {
  Tensor t = from_vector(values, shape);
  t.set_requires_grad(true);
  return t;
}

size_t position(const std::vector<std::string>& names, const std::string& name) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return i;
  }
  FAIL("no node " << name);
  return 0;
}

TEST_CASE("a deferred wait runs when nothing else is ready, before its gradient is used",
          "[autograd][engine]") {
  // Branch "other" is recorded first, so the engine (later nodes first) would finish the
  // awaited branch before it.
  const Tensor a = leaf({1, 2, 3}, {1, 3});
  const Tensor w_other = leaf({1, 1, 1}, {1, 3});
  const Tensor other = exp(linear(a, w_other, Tensor()));  // (1, 1)

  const Tensor x = leaf({0.5, -1, 2}, {1, 3});
  const Tensor w = leaf({2, 0, 1, 0, 3, 1}, {2, 3});
  auto [y, wait] = await_gradient(x);
  std::vector<std::string> events;
  const Tensor z = linear(y, w, Tensor(), [&events, wait = wait](const Tensor& dx) {
    events.push_back("started");
    // Stands in for a sum over a group, done in place when the wait runs.
    wait->set([&events, dx] {
      events.push_back("waited");
      dx.copy_(dx * 3.0);
    });
  });
  Order order;
  {
    const BackwardObserverGuard guard(order);
    backward(add(sum(z, {}, false), sum(other, {}, false)));
  }
  CHECK(events == std::vector<std::string>{"started", "waited"});
  // x's gradient is column sums of w, tripled by the wait.
  CHECK(x.grad().to_vector<float>() == std::vector<float>{6, 9, 6});
  // Everything of the other branch ran before the wait.
  const size_t awaited = position(order.names, "await_gradient");
  CHECK(position(order.names, "exp") < awaited);
  size_t linears = 0;
  for (size_t i = 0; i < order.names.size(); ++i) {
    if (order.names[i] == "linear") {
      ++linears;
      CHECK(i < awaited);
    }
  }
  CHECK(linears == 2);
  CHECK(order.names.back() == "AccumulateGrad");  // x's, after the wait
}

TEST_CASE("await_gradient without a gradient to wait for is the input itself",
          "[autograd][engine]") {
  const Tensor x = from_vector(std::vector<float>{1, 2}, {2});
  auto [y, wait] = await_gradient(x);
  CHECK(y.is_same(x));
  const Tensor p = leaf({1, 2}, {2});
  NoGradGuard no_grad;
  CHECK(await_gradient(p).first.is_same(p));
}

}  // namespace
}  // namespace tessera
