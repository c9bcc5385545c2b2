// Pipeline partitioning (deepspeed/runtime/pipe/module.py): DeepSpeed's uniform split, the
// balanced split against an exhaustive search of every split, DeepSpeed's tie rule, the
// partition methods over layer descriptions, and their errors.
#include "parallel/pipeline/partition.h"

#include <catch2/catch.hpp>
#include <limits>
#include <random>
#include <vector>

namespace tessera::parallel::pipeline {
namespace {

using Parts = std::vector<int>;

double spread(const std::vector<double>& w, const Parts& parts) {
  double hi = -1e300, lo = 1e300;
  for (size_t s = 0; s + 1 < parts.size(); ++s) {
    double sum = 0;
    for (int i = parts[s]; i < parts[s + 1]; ++i) sum += w[i];
    hi = std::max(hi, sum);
    lo = std::min(lo, sum);
  }
  return hi - lo;
}

// The smallest spread over every split into m non-empty parts, by enumeration.
double exhaustive_best(const std::vector<double>& w, int m) {
  const int n = static_cast<int>(w.size());
  double best = std::numeric_limits<double>::infinity();
  Parts parts(m + 1);
  parts[0] = 0;
  parts[m] = n;
  // Cut points 1 <= c_1 < ... < c_{m-1} <= n - 1, as an odometer.
  std::vector<int> cut(m - 1);
  for (int j = 0; j < m - 1; ++j) cut[j] = j + 1;
  while (true) {
    for (int j = 0; j < m - 1; ++j) parts[j + 1] = cut[j];
    best = std::min(best, spread(w, parts));
    int j = m - 2;
    while (j >= 0 && cut[j] == n - (m - 1 - j)) --j;
    if (j < 0) break;
    ++cut[j];
    for (int q = j + 1; q < m - 1; ++q) cut[q] = cut[q - 1] + 1;
  }
  return best;
}

TEST_CASE("partition_uniform follows DeepSpeed", "[pipeline]") {
  CHECK(partition_uniform(10, 4) == Parts{0, 3, 6, 8, 10});
  CHECK(partition_uniform(8, 4) == Parts{0, 2, 4, 6, 8});
  CHECK(partition_uniform(3, 5) == Parts{0, 1, 2, 3, 3, 3});
  CHECK(partition_uniform(7, 1) == Parts{0, 7});
  CHECK_THROWS_WITH(partition_uniform(3, 0), Catch::Contains("found 3 items and 0 parts"));
}

TEST_CASE("partition_balanced: DeepSpeed's answers, and the optimum where it misses",
          "[pipeline]") {
  CHECK(partition_balanced({1, 1, 1, 1}, 2) == Parts{0, 2, 4});
  CHECK(partition_balanced({5, 1, 1, 1, 1, 1}, 2) == Parts{0, 1, 6});
  // Equal spreads: DeepSpeed takes the later split point.
  CHECK(partition_balanced({1, 0, 1}, 2) == Parts{0, 2, 3});
  // No more items than parts: uniform.
  CHECK(partition_balanced({4, 4}, 3) == Parts{0, 1, 2, 2});
  // Note [Balanced partition]: DeepSpeed's program keeps (2 2 | 7 | 1 | 9), spread 8.
  CHECK(partition_balanced({2, 2, 7, 1, 9}, 4) == Parts{0, 1, 2, 4, 5});
  CHECK_THROWS_WITH(partition_balanced({1, -1}, 1), Catch::Contains("expected weights >= 0"));
}

TEST_CASE("partition_balanced reaches the smallest spread of every split", "[pipeline]") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 9);
    const int m = 1 + static_cast<int>(rng() % std::min(n, 5));
    std::vector<double> w(n);
    for (double& x : w) x = static_cast<double>(rng() % 10);
    const Parts parts = partition_balanced(w, m);
    INFO("trial " << trial);
    REQUIRE(parts.size() == static_cast<size_t>(m + 1));
    CHECK(parts.front() == 0);
    CHECK(parts.back() == n);
    for (int s = 0; s < m; ++s) CHECK(parts[s] < parts[s + 1]);  // no empty stage
    CHECK(spread(w, parts) == exhaustive_best(w, m));
  }
}

TEST_CASE("partition_layers: parameters, uniform and type:<regex>", "[pipeline]") {
  // A GPT's sequence: embedding, 6 equal blocks, final norm, LM head (tied: no parameters).
  std::vector<LayerInfo> gpt = {{"Embedding", 600}};
  for (int i = 0; i < 6; ++i) gpt.push_back({"Block", 300});
  gpt.push_back({"LayerNorm", 2});
  gpt.push_back({"LmHead", 0});
  CHECK(partition_layers(gpt, 3, "uniform") == Parts{0, 3, 6, 9});
  // Balanced by parameters: the embedding weighs as two blocks.
  CHECK(partition_layers(gpt, 2, "parameters") == Parts{0, 3, 9});
  // Only blocks count: three blocks per stage.
  CHECK(partition_layers(gpt, 2, "type:block") == Parts{0, 4, 9});
  CHECK(partition_layers(gpt, 2, "type:BLO") == Parts{0, 4, 9});  // case-insensitive search
  CHECK_THROWS_WITH(partition_layers(gpt, 2, "type:attention"),
                    Catch::Contains("Partitioning 'attention' found no valid layers to "
                                    "partition."));
  CHECK_THROWS_WITH(partition_layers(gpt, 2, "best"),
                    Catch::Contains("expected \"parameters\", \"uniform\" or \"type:<regex>\", "
                                    "found \"best\""));
  CHECK_THROWS_WITH(partition_layers(gpt, 2, "profile"), Catch::Contains("not implemented"));
  CHECK_THROWS_WITH(check_partition_method("type:(", "pipeline.partition_method"),
                    Catch::Contains("\"type:(\" is not a valid regular expression"));
}

}  // namespace
}  // namespace tessera::parallel::pipeline
