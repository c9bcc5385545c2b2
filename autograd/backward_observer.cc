#include "autograd/backward_observer.h"

namespace tessera {
namespace {

thread_local BackwardObserver* current_observer = nullptr;

}  // namespace

BackwardObserver* backward_observer() { return current_observer; }

BackwardObserverGuard::BackwardObserverGuard(BackwardObserver& observer)
    : previous_(current_observer) {
  current_observer = &observer;
}

BackwardObserverGuard::~BackwardObserverGuard() { current_observer = previous_; }

}  // namespace tessera
