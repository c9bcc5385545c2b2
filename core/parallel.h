// Host threading: one runtime (OpenMP) for the whole process, shared with Eigen.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera {

// Splits [0, n) into chunks of at least `grain` items and runs fn(begin, end) on the
// thread pool. Runs inline when n <= grain or when already inside a parallel region.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Threads used by parallel_for and Eigen (OpenMP's max threads).
int num_threads();
// True inside a parallel_for body (or any OpenMP parallel region): work there runs inline.
bool in_parallel_region();
void set_num_threads(int n);

}  // namespace tessera
