// The NCCL backend of Communicator (parallel/comm/communicator.h): one rank per GPU, CUDA tensors,
// each communicator with its own CUDA stream.
//
//   MpiRuntime mpi(&argc, &argv);
//   std::unique_ptr<Communicator> cpu = mpi_world(mpi, {});
//   std::unique_ptr<Communicator> gpu = nccl_group(*cpu, /*device=*/local_rank, {});
//
// Note [NCCL waits under a deadline]
// NCCL's unique id is made by rank 0 and broadcast over a CPU communicator (MPI across
// processes, or thread ranks with one GPU each), then every rank joins with
// ncclCommInitRank. An operation is enqueued on the communicator's stream after the work
// already queued on the device (the stream waits for the legacy default stream, which
// Tessera's CUDA kernels use), and the call returns when the stream has finished it, so
// the contract's blocking semantics hold. While waiting, the rank polls the stream and
// ncclCommGetAsyncError: an asynchronous NCCL error, or a peer that does not arrive within
// CommOptions::timeout, aborts the NCCL communicator (ncclCommAbort, which also ends the
// kernels stuck waiting for the peer) and fails the operation with the group, the op and
// its sequence number. NCCL refuses two ranks on one GPU, so multi-rank runs need as many
// GPUs as ranks.
#pragma once

#include <memory>

#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// A group over the same ranks as `bootstrap` (any backend on the CPU), named "nccl", whose
// rank r communicates tensors on cuda:`device`. Collective over `bootstrap`. Throws when
// the binary was built without CUDA or the device does not exist.
std::unique_ptr<Communicator> nccl_group(Communicator& bootstrap, int device, CommOptions options);

}  // namespace tessera::parallel
