#include "core/parallel.h"

#include <omp.h>

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace tessera {

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), max_chunks));
  if (threads <= 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
  // Exceptions must not cross the OpenMP region boundary: keep the first and rethrow.
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t nt = omp_get_num_threads();
    const int64_t begin = n * t / nt;
    const int64_t end = n * (t + 1) / nt;
    try {
      if (begin < end) fn(begin, end);
    } catch (...) {
#pragma omp critical(tessera_parallel_for_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

int num_threads() { return omp_get_max_threads(); }

bool in_parallel_region() { return omp_in_parallel() != 0; }

void set_num_threads(int n) {
  TS_CHECK(n >= 1, "[set_num_threads] expected at least 1 thread, found ", n);
  omp_set_num_threads(n);
}

}  // namespace tessera
