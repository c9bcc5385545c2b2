// The 3D process grid against DeepSpeed's topology (deepspeed/runtime/pipe/topology.py):
// the rank formula, the docstring's comm lists and filter_match, the world-size errors, and
// the groups make_parallel_groups builds on thread ranks (membership read back through an
// all_gather of world ranks, and each rank's rank in each group).
#include "parallel/topology.h"

#include <catch2/catch.hpp>
#include <mutex>
#include <vector>

#include "core/factories.h"
#include "parallel/comm/thread_comm.h"

namespace tessera::parallel {
namespace {

using Lists = std::vector<std::vector<int>>;

TEST_CASE("grid ranks follow rank = pipe * dp * mp + data * mp + model", "[topology]") {
  const ProcessGrid grid(2, 3, 4);
  REQUIRE(grid.world_size() == 24);
  int expected = 0;
  for (int p = 0; p < 2; ++p) {
    for (int d = 0; d < 3; ++d) {
      for (int m = 0; m < 4; ++m) {
        CHECK(grid.rank({p, d, m}) == expected);
        CHECK(grid.coord(expected) == GridCoord{p, d, m});
        ++expected;
      }
    }
  }
  CHECK(grid.describe(17) == "pipe 1, data 1, model 1");
}

TEST_CASE("comm lists and filter_match equal DeepSpeed's docstring example", "[topology]") {
  const ProcessGrid grid(2, 2, 2);
  CHECK(grid.comm_lists(GridAxis::pipe) == Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(grid.comm_lists(GridAxis::data) == Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(grid.comm_lists(GridAxis::model) == Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(grid.filter_match(0, 1, std::nullopt) == std::vector<int>{2, 3});
  CHECK(grid.filter_match(std::nullopt, std::nullopt, 1) == std::vector<int>{1, 3, 5, 7});
  // An axis of size 1 gives singleton lists.
  CHECK(ProcessGrid(1, 3, 1).comm_lists(GridAxis::pipe) == Lists{{0}, {1}, {2}});
  CHECK(ProcessGrid(1, 3, 1).comm_lists(GridAxis::data) == Lists{{0, 1, 2}});
}

TEST_CASE("a world that does not factor is a clear error", "[topology]") {
  const ProcessGrid g = ProcessGrid::for_world(12, 2, 3);
  CHECK(g.pipe_size() == 2);
  CHECK(g.data_size() == 2);
  CHECK(g.model_size() == 3);
  CHECK_THROWS_WITH(
      ProcessGrid::for_world(6, 4, 1),
      Catch::Contains("[topology] a world of 6 ranks does not factor into pipeline "
                      "stages x tensor-parallel size x data-parallel size: "
                      "expected a multiple of 4 (4 stages x tensor-parallel size 1)"));
  CHECK_THROWS_WITH(ProcessGrid::for_world(8, 0, 2),
                    Catch::Contains("expected pipeline stages and tensor-parallel size of at "
                                    "least 1, found 0 and 2"));
  CHECK_THROWS_WITH(ProcessGrid(2, 2, 2).rank({0, 2, 0}),
                    Catch::Contains("coordinates (pipe 0, data 2, model 0) are outside the grid "
                                    "(2, 2, 2)"));
  CHECK_THROWS_WITH(ProcessGrid(2, 2, 2).coord(8),
                    Catch::Contains("rank 8 is outside a grid of 8 ranks"));
}

// The world ranks of `group`'s members in group-rank order.
std::vector<int> members(Communicator& group, int world_rank) {
  const Tensor mine = scalar_tensor(world_rank, {DType::i32}).view({1});
  const Tensor all = zeros({group.size()}, {DType::i32});
  group.all_gather(mine, all);
  return all.to_vector<int>();
}

TEST_CASE("make_parallel_groups splits the world along each axis", "[topology]") {
  struct Case {
    int pipe, data, model;
  };
  for (const Case& k : {Case{2, 2, 2}, Case{3, 1, 2}, Case{1, 4, 1}, Case{2, 3, 1}}) {
    const ProcessGrid grid(k.pipe, k.data, k.model);
    DYNAMIC_SECTION("grid (" << k.pipe << ", " << k.data << ", " << k.model << ")") {
      std::mutex mutex;
      std::vector<std::vector<int>> data(grid.world_size()), pipe(grid.world_size()),
          model(grid.world_size()), pipe_model(grid.world_size());
      std::vector<GridCoord> coords(grid.world_size());
      std::vector<std::vector<int>> group_ranks(grid.world_size());
      run_thread_ranks(grid.world_size(), [&](Communicator& world) {
        const ParallelGroups g = make_parallel_groups(world, grid);
        const int r = world.rank();
        std::vector<int> d = members(*g.data, r), p = members(*g.pipe, r), m = members(*g.model, r),
                         pm = members(*g.pipe_model, r);
        std::lock_guard<std::mutex> lock(mutex);
        data[r] = d, pipe[r] = p, model[r] = m, pipe_model[r] = pm;
        coords[r] = g.coord;
        group_ranks[r] = {g.data->rank(), g.pipe->rank(), g.model->rank(), g.pipe_model->rank()};
      });
      auto list_of = [&](GridAxis axis, int r) {
        for (const std::vector<int>& l : grid.comm_lists(axis)) {
          for (int x : l) {
            if (x == r) return l;
          }
        }
        FAIL("rank " << r << " is in no list");
        return std::vector<int>{};
      };
      for (int r = 0; r < grid.world_size(); ++r) {
        INFO("rank " << r << " (" << grid.describe(r) << ")");
        const GridCoord c = grid.coord(r);
        CHECK(coords[r] == c);
        CHECK(data[r] == list_of(GridAxis::data, r));
        CHECK(pipe[r] == list_of(GridAxis::pipe, r));
        CHECK(model[r] == list_of(GridAxis::model, r));
        CHECK(pipe_model[r] == grid.filter_match(std::nullopt, c.data, std::nullopt));
        CHECK(group_ranks[r] ==
              std::vector<int>{c.data, c.pipe, c.model, c.pipe * grid.model_size() + c.model});
      }
    }
  }
}

TEST_CASE("make_parallel_groups refuses a world of another size", "[topology]") {
  CHECK_THROWS_WITH(run_thread_ranks(4,
                                     [](Communicator& world) {
                                       make_parallel_groups(world, {2, 1, 3});
                                     }),
                    Catch::Contains("[topology] a grid of (2, 1, 3) needs 6 ranks; found a group "
                                    "of 4"));
}

}  // namespace
}  // namespace tessera::parallel
