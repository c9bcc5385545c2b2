// A stage's point-to-point lanes: one group per direction of each stage-to-stage link, so
// a pipeline stage can start its receives ahead of where it needs them.
//
// Note [Pipe lanes]
// With one communication worker per group (AsyncCollectives, Note [Asynchronous
// collectives] in parallel/comm/async_collectives.h), a receive started before its tensor
// is needed would hold up every operation queued behind it on that worker, sends to the
// other neighbour among them, and two stages each waiting on the other's queued operations
// deadlock. So each direction of each link between stages s and s + 1 gets a group of its
// own, split off the pipe group: its two stages, one that only sends and one that only
// receives, each with a worker of its own. A lane carries one kind of message one way, in
// order, so any number of receives may be started ahead on it, and a stage's sends and
// receives travel at the same time, as on a full-duplex link (each lane has its own
// simulated link timeline, Note [Simulated link] in parallel/comm/communicator.h). Lanes
// count their operations as the pipe group's (Communicator::add_stats, at the executor's
// batch ends), so the pipe group's stats say what the stages sent however it travelled.
// A backend whose operations run on the caller's thread (NCCL, host staging) gets no
// lanes: AsyncCollectives has no worker there, and the pipe group carries everything.
#pragma once

#include <memory>
#include <vector>

#include "parallel/comm/async_collectives.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel::pipeline {

// One direction of one link, seen from one of its stages.
struct Lane {
  std::unique_ptr<Communicator> group;  // the link's two stages; null without that neighbour
  std::unique_ptr<AsyncCollectives> async;
  int peer = 0;  // the other stage's rank in `group`
  bool exists() const { return group != nullptr; }
};

// Stage s's lanes: activations go forward (s to s + 1), gradients back (s + 1 to s).
struct PipeLanes {
  Lane activations_out;  // to s + 1
  Lane activations_in;   // from s - 1
  Lane gradients_out;    // to s - 1
  Lane gradients_in;     // from s + 1
  // Those this stage has (a lane without a neighbour is missing).
  std::vector<Lane*> existing();
};

// Whether `pipe` gets lanes (Note [Pipe lanes]): two stages or more on a backend that runs
// operations on a worker thread. The same on every rank of the group.
bool uses_lanes(const Communicator& pipe);

// Splits the lanes off `pipe` (rank s = stage s), with the pipe group's simulated link.
// Collective over `pipe`; requires uses_lanes(pipe). `pipe` must outlive the lanes.
PipeLanes make_pipe_lanes(Communicator& pipe);

// Gives the lanes `pipe`'s simulated link as it is now (set_simulated_link may have been
// called since they were made).
void follow_pipe_link(PipeLanes& lanes, const Communicator& pipe);

// Counts the lanes' operations as `pipe`'s and clears theirs. Call only while no lane has
// operations in flight.
void fold_lane_stats(PipeLanes& lanes, Communicator& pipe);

}  // namespace tessera::parallel::pipeline
