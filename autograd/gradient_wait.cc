#include "autograd/gradient_wait.h"

#include "autograd/record.h"

namespace tessera {
namespace {

// Identity in backward after the registered wait; run only when nothing else is ready.
class AwaitGradient final : public Node {
 public:
  explicit AwaitGradient(std::shared_ptr<GradientWait> wait) : wait_(std::move(wait)) {}
  std::string name() const override { return "await_gradient"; }
  bool deferred() const override { return true; }
  TensorList apply(const TensorList& grad_outputs) override {
    wait_->run();
    return {grad_outputs[0]};
  }
  void release_saved() override {}

 private:
  std::shared_ptr<GradientWait> wait_;
};

}  // namespace

void GradientWait::run() {
  const std::function<void()> wait = std::move(wait_);
  wait_ = nullptr;
  if (wait) wait();
}

std::pair<Tensor, std::shared_ptr<GradientWait>> await_gradient(const Tensor& x) {
  auto wait = std::make_shared<GradientWait>();
  if (!needs_grad({&x})) return {x, wait};
  Tensor y = x.detach();
  record(std::make_shared<AwaitGradient>(wait), {x}, {&y});
  return {y, wait};
}

}  // namespace tessera
