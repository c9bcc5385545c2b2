#include "parallel/topology.h"

#include <sstream>

#include "core/error.h"

namespace tessera::parallel {

const char* axis_name(GridAxis axis) {
  switch (axis) {
    case GridAxis::pipe:
      return "pipe";
    case GridAxis::data:
      return "data";
    case GridAxis::model:
      return "model";
  }
  return "?";
}

ProcessGrid::ProcessGrid(int pipe, int data, int model) : pipe_(pipe), data_(data), model_(model) {
  TS_CHECK(pipe >= 1 && data >= 1 && model >= 1,
           "[topology] expected pipe, data and model sizes of at least 1, found (", pipe, ", ",
           data, ", ", model, ")");
}

ProcessGrid ProcessGrid::for_world(int world, int pipe, int model) {
  TS_CHECK(pipe >= 1 && model >= 1,
           "[topology] expected pipeline stages and tensor-parallel size of at least 1, found ",
           pipe, " and ", model);
  TS_CHECK(world % (pipe * model) == 0, "[topology] a world of ", world,
           " ranks does not factor into pipeline stages x tensor-parallel size x data-parallel "
           "size: expected a multiple of ",
           pipe * model, " (", pipe, " stages x tensor-parallel size ", model, ")");
  return ProcessGrid(pipe, world / (pipe * model), model);
}

int ProcessGrid::size(GridAxis axis) const {
  switch (axis) {
    case GridAxis::pipe:
      return pipe_;
    case GridAxis::data:
      return data_;
    case GridAxis::model:
      return model_;
  }
  return 0;
}

int ProcessGrid::rank(const GridCoord& c) const {
  TS_CHECK(c.pipe >= 0 && c.pipe < pipe_ && c.data >= 0 && c.data < data_ && c.model >= 0 &&
               c.model < model_,
           "[topology] coordinates (pipe ", c.pipe, ", data ", c.data, ", model ", c.model,
           ") are outside the grid (", pipe_, ", ", data_, ", ", model_, ")");
  return (c.pipe * data_ + c.data) * model_ + c.model;
}

GridCoord ProcessGrid::coord(int rank) const {
  TS_CHECK(rank >= 0 && rank < world_size(), "[topology] rank ", rank, " is outside a grid of ",
           world_size(), " ranks");
  return {rank / (data_ * model_), (rank / model_) % data_, rank % model_};
}

std::vector<std::vector<int>> ProcessGrid::comm_lists(GridAxis axis) const {
  // Walk the ranks in order; a rank at coordinate 0 on `axis` starts a new list.
  std::vector<std::vector<int>> lists;
  for (int r = 0; r < world_size(); ++r) {
    GridCoord c = coord(r);
    int* along = axis == GridAxis::pipe ? &c.pipe : axis == GridAxis::data ? &c.data : &c.model;
    if (*along != 0) continue;
    std::vector<int> list;
    for (int i = 0; i < size(axis); ++i) {
      *along = i;
      list.push_back(rank(c));
    }
    lists.push_back(std::move(list));
  }
  return lists;
}

std::vector<int> ProcessGrid::filter_match(std::optional<int> pipe, std::optional<int> data,
                                           std::optional<int> model) const {
  std::vector<int> out;
  for (int r = 0; r < world_size(); ++r) {
    const GridCoord c = coord(r);
    if ((!pipe || c.pipe == *pipe) && (!data || c.data == *data) && (!model || c.model == *model)) {
      out.push_back(r);
    }
  }
  return out;
}

std::string ProcessGrid::describe(int rank) const {
  const GridCoord c = coord(rank);
  std::ostringstream s;
  s << "pipe " << c.pipe << ", data " << c.data << ", model " << c.model;
  return s.str();
}

ParallelGroups make_parallel_groups(Communicator& world, const ProcessGrid& grid) {
  TS_CHECK(world.size() == grid.world_size(), "[topology] a grid of (", grid.pipe_size(), ", ",
           grid.data_size(), ", ", grid.model_size(), ") needs ", grid.world_size(),
           " ranks; found a group of ", world.size());
  const GridCoord c = grid.coord(world.rank());
  const int dp = grid.data_size(), mp = grid.model_size();
  ParallelGroups g{grid, c, nullptr, nullptr, nullptr, nullptr};
  // Color: the coordinates on the other axes; key: the coordinate along the group's axis.
  g.data = world.split(c.pipe * mp + c.model, c.data);
  g.pipe = world.split(c.data * mp + c.model, c.pipe);
  g.model = world.split(c.pipe * dp + c.data, c.model);
  g.pipe_model = world.split(c.data, c.pipe * mp + c.model);
  return g;
}

}  // namespace tessera::parallel
