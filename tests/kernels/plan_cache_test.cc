// The bounded plan cache (kernels/plan_cache.h): hits, least-recently-used eviction, and a
// key inserted twice refused.
#include "kernels/plan_cache.h"

#include <catch2/catch.hpp>
#include <string>

namespace tessera {
namespace {

TEST_CASE("the plan cache keeps the most recently used plans", "[plan_cache]") {
  kernels::PlanCache<std::string> cache(2);
  CHECK(cache.find({1, 2}) == nullptr);
  cache.insert({1, 2}, "a");
  cache.insert({3}, "b");
  REQUIRE(cache.find({1, 2}) != nullptr);
  CHECK(*cache.find({1, 2}) == "a");  // now the most recently used: {3} goes first
  cache.insert({4}, "c");
  CHECK(cache.size() == 2);
  CHECK(cache.find({3}) == nullptr);
  CHECK(*cache.find({1, 2}) == "a");
  CHECK(*cache.find({4}) == "c");
  cache.insert({5}, "d");  // {1, 2} was used before {4}
  CHECK(cache.find({1, 2}) == nullptr);
  CHECK(*cache.find({5}) == "d");
}

TEST_CASE("the plan cache refuses a second plan under one key and a zero capacity",
          "[plan_cache]") {
  kernels::PlanCache<int> cache(4);
  cache.insert({7}, 1);
  CHECK_THROWS_WITH(cache.insert({7}, 2), Catch::Contains("already cached"));
  CHECK(*cache.find({7}) == 1);
  CHECK_THROWS_WITH(kernels::PlanCache<int>(0), Catch::Contains("capacity of at least 1"));
}

}  // namespace
}  // namespace tessera
