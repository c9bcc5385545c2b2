#include "parallel/pipeline/lanes.h"

#include "core/error.h"

namespace tessera::parallel::pipeline {
namespace {

// The lanes of one direction: two splits, the first pairing stages (0, 1), (2, 3), ..., the
// second (1, 2), (3, 4), ...; each split gives a stage at most one group. The lower stage is
// rank 0 of its lane.
void split_direction(Communicator& pipe, Lane& to_next, Lane& to_previous) {
  const int s = pipe.rank(), stages = pipe.size();
  for (int parity = 0; parity < 2; ++parity) {
    const int lower = s % 2 == parity ? s : s - 1;  // the pair's lower stage
    const bool paired = lower >= 0 && lower + 1 < stages;
    std::unique_ptr<Communicator> group = pipe.split(paired ? lower : -1, s);
    if (!group) continue;
    Lane& lane = lower == s ? to_next : to_previous;
    lane.peer = lower == s ? 1 : 0;
    lane.group = std::move(group);
    lane.async = std::make_unique<AsyncCollectives>(*lane.group);
  }
}

}  // namespace

std::vector<Lane*> PipeLanes::existing() {
  std::vector<Lane*> out;
  for (Lane* lane : {&activations_out, &activations_in, &gradients_out, &gradients_in}) {
    if (lane->exists()) out.push_back(lane);
  }
  return out;
}

bool uses_lanes(const Communicator& pipe) { return pipe.size() > 1 && pipe.runs_on_any_thread(); }

PipeLanes make_pipe_lanes(Communicator& pipe) {
  TS_CHECK(uses_lanes(pipe), "[pipeline] internal error: lanes of a group of ", pipe.size(),
           " whose backend runs operations on the caller's thread only");
  PipeLanes lanes;
  // Activations first, then gradients: the same order of splits on every rank.
  split_direction(pipe, lanes.activations_out, lanes.activations_in);
  split_direction(pipe, lanes.gradients_in, lanes.gradients_out);
  return lanes;
}

void follow_pipe_link(PipeLanes& lanes, const Communicator& pipe) {
  for (Lane* lane : lanes.existing()) lane->group->set_simulated_link(pipe.simulated_link());
}

void fold_lane_stats(PipeLanes& lanes, Communicator& pipe) {
  for (Lane* lane : lanes.existing()) {
    pipe.add_stats(lane->group->stats());
    lane->group->reset_stats();
  }
}

}  // namespace tessera::parallel::pipeline
