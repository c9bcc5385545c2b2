#include "autograd/forward_observer.h"

namespace tessera {
namespace {

thread_local ForwardObserver* current_observer = nullptr;

}  // namespace

ForwardObserver* forward_observer() { return current_observer; }

ForwardObserverGuard::ForwardObserverGuard(ForwardObserver& observer)
    : previous_(current_observer) {
  current_observer = &observer;
}

ForwardObserverGuard::~ForwardObserverGuard() { current_observer = previous_; }

ModuleScope::ModuleScope(const Module& m) : module_(m), observer_(current_observer) {
  if (observer_) observer_->enter(module_);
}

ModuleScope::~ModuleScope() {
  if (observer_) observer_->exit(module_);
}

}  // namespace tessera
