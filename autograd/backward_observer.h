// Watching a backward pass from outside: which node's gradient function runs (the device
// time profile of tools/bench/step_profile.h).
//
// Note [Backward observers]
// A BackwardObserver installed on a thread (BackwardObserverGuard, thread-local as the
// ForwardObserver of Note [Forward observers]) hears begin(node) and end(node) around each
// node's gradient function in backward() (autograd/engine.cc), which includes adding its
// results into the gradients of the nodes they flow to. It never changes what the backward
// computes. Without an observer each node costs one thread-local load.
#pragma once

#include "autograd/node.h"

namespace tessera {

class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  // `node`'s gradient function is about to run.
  virtual void begin(const Node& node) = 0;
  // It returned or threw.
  virtual void end(const Node& node) noexcept = 0;
};

// The observer installed on this thread, or null.
BackwardObserver* backward_observer();

// Installs `observer` on this thread for the guard's lifetime (the previous one after).
class BackwardObserverGuard {
 public:
  explicit BackwardObserverGuard(BackwardObserver& observer);
  ~BackwardObserverGuard();
  BackwardObserverGuard(const BackwardObserverGuard&) = delete;
  BackwardObserverGuard& operator=(const BackwardObserverGuard&) = delete;

 private:
  BackwardObserver* previous_;
};

}  // namespace tessera
