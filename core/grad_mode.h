// Whether differentiable ops record the graph on this thread.
//
// Thread-local by necessity (each rank thread of the thread backend runs its own
// forward); RAII guards restore the previous mode.
#pragma once

namespace tessera {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Disables graph recording for its lifetime (inference, optimizer steps, op forwards).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// Enables graph recording for its lifetime (recomputation inside activation checkpointing).
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace tessera
