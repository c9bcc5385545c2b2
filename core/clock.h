// Intervals on the monotonic clock, for the timings that logs and benchmarks report.
#pragma once

#include <chrono>

namespace tessera {

// Seconds from `start` to now, on std::chrono::steady_clock.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tessera
