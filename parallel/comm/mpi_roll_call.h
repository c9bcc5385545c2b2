// Which ranks of an MPI communicator had not arrived when an operation timed out: the
// roll call of Note [Roll call]. Internal to the MPI backend (parallel/comm/mpi_comm.cc).
//
// Note [Roll call]
// MPI does not say which ranks a collective is waiting for. So a rank whose operation
// timed out asks the others: it sends each one its own position (the op and this rank's
// number for it) with a tag of its own, then listens for up to a second. Every rank that
// is waiting in an operation of the same communicator answers from its wait loop, once the
// wait has lasted past the first fast polls (Note [MPI waits under a deadline]), with its
// position; a rank that timed out too has already sent its own. An ask that arrives while
// this rank is still waiting is answered there, and the asker's position is remembered as
// heard: the asker is listening in its own roll call and will not answer ours (a rank
// whose clock runs a few milliseconds ahead times out first). A rank that does not
// answer has exited, is stopped, or is busy outside communication (computing, or waiting
// on another group): it is named as missing. Nothing of this runs unless an operation has
// already failed, so it costs the healthy path one MPI_Iprobe per sleep of a long wait.
// The messages are small and their buffers are kept for as long as the process runs, like
// those of the operation that timed out (MPI may still be sending them).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// Where a rank is: in operation `op`, its `number`th operation on the communicator.
struct CommPosition {
  CommOp op = CommOp::barrier;
  int64_t number = 0;
};

// The positions roll calls reported, by rank.
using HeardPositions = std::map<int, CommPosition>;

// Answers every roll call waiting in `comm` with `here`, and records each asker's position
// in `askers`. `keep` receives the send buffers.
void answer_roll_calls(MPI_Comm comm, CommPosition here, HeardPositions& askers,
                       std::vector<Tensor>& keep);

// Asks the other ranks of `comm` (this is `rank` of `size`) where they are, listening up to
// `listen`, and says who had not arrived at `here`: "rank(s) 2, 3 did not answer ... ;
// rank 1 is in recv #4". `heard` holds the ranks that asked while this one waited (from
// answer_roll_calls); they are not waited for again. `keep` receives the send buffers.
std::string roll_call(MPI_Comm comm, int rank, int size, CommPosition here,
                      std::chrono::milliseconds listen, HeardPositions heard,
                      std::vector<Tensor>& keep);

}  // namespace tessera::parallel
