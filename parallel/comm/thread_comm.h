// The thread backend: N ranks as threads of one process, communicating through shared
// memory. It runs every collective of Note [Communicator contract], with timeouts and
// cross-rank checks, so multi-rank logic is tested fast and in-process; the MPI and NCCL
// backends carry the same logic across processes and GPUs.
//
// Note [Thread collectives]
// Each operation is two rendezvous: every rank posts its buffers and waits for all
// (arrival), reads what it needs from its peers' buffers into its own outputs, and waits
// for all again (departure) so no buffer changes while a peer still reads it. At arrival
// every rank checks that all ranks called the same op with the same sizes, so a mismatch
// fails on every rank at once instead of corrupting data. Reductions add the ranks' values
// in rank order on every rank, so all ranks get the same bits.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// The `size` ranks of one new group, named "world"; give rank r's communicator to the
// thread that plays rank r.
std::vector<std::unique_ptr<Communicator>> make_thread_group(int size, CommOptions options = {});

// Runs fn(comm) on `size` threads, one per rank of a new group, and waits for all of them;
// then rethrows the error of the lowest rank that threw, if any. Each rank's thread starts
// with the caller's OpenMP thread count (num_threads() in core/parallel.h).
void run_thread_ranks(int size, const std::function<void(Communicator&)>& fn,
                      CommOptions options = {});

}  // namespace tessera::parallel
