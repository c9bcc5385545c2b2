// A communicator for tensors on any device over a backend that moves host memory only:
// thread ranks, or MPI without CUDA support.
//
//   run_thread_ranks(2, [](Communicator& cpu) {
//     std::unique_ptr<Communicator> any = host_staged(cpu);
//     any->all_reduce(cuda_tensor);  // copied to the host, reduced, copied back
//   });
//
// Note [Host-staged communication]
// Each operation copies its device operands into host tensors, runs the inner backend's
// operation on them, and copies the results back into the device operands; host operands
// go to the backend as they are. The values equal the inner backend's on host copies of
// the same data, so a parallel mode run over this wrapper on a device equals its CPU run
// up to the device's kernels. It is how several ranks share one GPU in tests (NCCL refuses
// two ranks of one communicator on one device, Note [Two NCCL ranks on one GPU] in
// tests/gpu/nccl_comm_test.cc), at the cost of two host round trips per operation: NCCL
// is the fast path whenever each rank has its own GPU.
#pragma once

#include <memory>

#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// A group over the same ranks as `inner` (which must outlive it), named like it, that takes
// tensors on any device. Splits wrap the inner group's splits.
std::unique_ptr<Communicator> host_staged(Communicator& inner);

}  // namespace tessera::parallel
