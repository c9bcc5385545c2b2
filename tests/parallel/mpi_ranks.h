// What the MPI rank programs' test cases share (tests/parallel/mpi_comm_ranks.cc and
// mpi_reduction_ranks.cc, one binary run under mpirun by mpi_comm_test.sh).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/comm/mpi_comm.h"

namespace tessera::parallel::testing {

// Generous: 3 ranks share 2 cores, beside other tests.
inline constexpr std::chrono::milliseconds kTimeout = std::chrono::seconds(60);

// A fresh world communicator of the job (its own duplicate of MPI_COMM_WORLD), from the
// runtime main() made.
std::unique_ptr<Communicator> new_world(std::chrono::milliseconds timeout = kTimeout);

// Index of the first element where got and want differ, or -1.
template <class T>
inline int64_t first_mismatch(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace tessera::parallel::testing
