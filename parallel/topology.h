// DeepSpeed's 3D process grid (deepspeed/runtime/pipe/topology.py) and the explicit
// groups a rank communicates in.
//
// Note [3D grid]
// The world's ranks are laid out over the axes (pipe, data, model), the last fastest:
//   rank = pipe * (dp * mp) + data * mp + model
// as DeepSpeed's PipeModelDataParallelTopology. Tensor-parallel peers are adjacent ranks
// (inside one node, where their per-layer all-reduces are cheapest) and pipeline stages are
// the farthest apart (they exchange one activation per micro-batch). A rank's groups are
// the ranks that differ from it along one axis only: its data group reduces gradients, its
// pipe group carries activations between stages and the tied embedding's gradient, its
// model group holds the slices of one layer. The pipe x model group (every rank with its
// data index, one whole model replica) computes global gradient norms and overflow checks,
// as DeepSpeed's "model parallel group". Within each group a rank's rank is its coordinate
// on that axis (pipe x model: pipe * mp + model), so stage s is rank s of the pipe group.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"

namespace tessera::parallel {

enum class GridAxis { pipe, data, model };

// "pipe", "data" or "model".
const char* axis_name(GridAxis axis);

// A rank's place in the grid.
struct GridCoord {
  int pipe = 0;
  int data = 0;
  int model = 0;
  bool operator==(const GridCoord&) const = default;
};

// The (pipe, data, model) grid of Note [3D grid]; a value type with no communication.
class ProcessGrid {
 public:
  // Throws unless every size is at least 1.
  ProcessGrid(int pipe, int data, int model);
  // The grid of `world` ranks with `pipe` stages and `model` tensor-parallel ranks; the data
  // size is what is left. Throws, naming the numbers, when pipe * model does not divide
  // the world.
  static ProcessGrid for_world(int world, int pipe, int model);

  int pipe_size() const { return pipe_; }
  int data_size() const { return data_; }
  int model_size() const { return model_; }
  int size(GridAxis axis) const;
  int world_size() const { return pipe_ * data_ * model_; }

  // The rank at `c`; throws when a coordinate is out of range.
  int rank(const GridCoord& c) const;
  // The coordinates of `rank`; throws when it is not in [0, world_size).
  GridCoord coord(int rank) const;
  // DeepSpeed's get_axis_comm_lists: one list per combination of the other two axes, in
  // rank order, each holding the ranks along `axis` in ascending order.
  std::vector<std::vector<int>> comm_lists(GridAxis axis) const;
  // DeepSpeed's filter_match: the ranks whose given coordinates match, ascending.
  std::vector<int> filter_match(std::optional<int> pipe, std::optional<int> data,
                                std::optional<int> model) const;
  // "pipe 1, data 0, model 3"
  std::string describe(int rank) const;

 private:
  int pipe_, data_, model_;
};

// One rank's communicators over the grid (Note [3D grid]). A group of one is still a
// communicator (its collectives return at once), so code never special-cases an axis of
// size 1.
struct ParallelGroups {
  ProcessGrid grid;
  GridCoord coord;                           // this rank's place
  std::unique_ptr<Communicator> data;        // same pipe and model: gradient reduction
  std::unique_ptr<Communicator> pipe;        // same data and model: stage to stage
  std::unique_ptr<Communicator> model;       // same pipe and data: tensor slicing
  std::unique_ptr<Communicator> pipe_model;  // same data: one replica (norms, overflow)
};

// Splits `world`, whose rank r is grid rank r, into this rank's groups. Collective over
// world; throws when world's size is not the grid's.
ParallelGroups make_parallel_groups(Communicator& world, const ProcessGrid& grid);

}  // namespace tessera::parallel
