// Watching a forward pass from outside the model: which module's forward is running and
// which ops it records (Tessera's flops profiler, tools/trainer/flops_profiler.h).
//
// Note [Forward observers]
// A ForwardObserver installed on a thread (ForwardObserverGuard, thread-local like
// GradMode, as thread ranks run their forwards concurrently) hears enter(m) and exit(m)
// around every module forward that opens a ModuleCall (every Layer's call, a tied head's)
// or a ModuleScope (composite modules' forwards: a GPT block, its attention and MLP), and
// op() for every op recorded on the autograd graph (record() in autograd/record.h: the ops
// of a forward with gradients; an op on tensors that need none is not recorded and not
// seen). It never changes what the forward computes. Without an observer each call is one
// thread-local load.
#pragma once

#include <string>
#include <vector>

#include "autograd/node.h"

namespace tessera {

class Module;

class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // Module `m`'s forward begins; calls nest.
  virtual void enter(const Module& m) = 0;
  // Module `m`'s forward ends (returns or throws).
  virtual void exit(const Module& m) noexcept = 0;
  // An op was recorded: `node` (its name() and the outputs() it made) with `inputs`. The
  // node lives until the backward that runs it (or the graph's release).
  virtual void op(const Node& node, const TensorList& inputs) = 0;
};

// The observer installed on this thread, or null.
ForwardObserver* forward_observer();

// Installs `observer` on this thread for the guard's lifetime (the previous one after).
class ForwardObserverGuard {
 public:
  explicit ForwardObserverGuard(ForwardObserver& observer);
  ~ForwardObserverGuard();
  ForwardObserverGuard(const ForwardObserverGuard&) = delete;
  ForwardObserverGuard& operator=(const ForwardObserverGuard&) = delete;

 private:
  ForwardObserver* previous_;
};

// A composite module's forward, for observers only (no hooks: a module that reads no
// parameters of its own needs none):
//
//   Tensor Block::forward(const Tensor& x) const {
//     const ModuleScope scope(*this);
//     ...
class ModuleScope {
 public:
  explicit ModuleScope(const Module& m);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  const Module& module_;
  ForwardObserver* observer_;
};

}  // namespace tessera
