// FlatLayout: block boundaries, padding, ownership and shard/unshard round trips, checked
// against element-by-element bookkeeping.
#include "parallel/zero/flat_layout.h"

#include <catch2/catch.hpp>

#include "core/factories.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using tessera::testing::error_of;

std::vector<FlatParamInfo> sample_params() {
  return {{"a", {5}, 0},    {"b", {3}, 0}, {"c", {7}, 0},
          {"d", {2, 1}, 1}, {"e", {2}, 1}, {"f", {4, 5}, 1}};
}

TEST_CASE("blocks hold whole parameters of one group, padded to the world size", "[zero]") {
  const FlatLayout l = make_flat_layout(sample_params(), 3, 8);
  // [a b] (8 -> 9), [c] (7 -> 9), [d e] (4 -> 6; group 1 starts a block), [f] (20 -> 21).
  REQUIRE(l.blocks.size() == 4);
  CHECK(l.blocks[0].offset == 0);
  CHECK(l.blocks[0].numel == 9);
  CHECK(l.blocks[1].offset == 9);
  CHECK(l.blocks[1].numel == 9);
  CHECK(l.blocks[2].offset == 18);
  CHECK(l.blocks[2].numel == 6);
  CHECK(l.blocks[2].group == 1);
  CHECK(l.blocks[3].numel == 21);
  CHECK(l.blocks[3].chunk == 7);
  CHECK(l.blocks[3].shard_offset == 3 + 3 + 2);
  CHECK(l.numel == 45);
  CHECK(l.shard_numel() == 15);
  CHECK(l.param_numel == 39);
  CHECK(l.params[1].offset == 5);
  CHECK(l.params[4].offset == 20);
  CHECK(l.params[5].block == 3);
  CHECK(l.chunk_offset(3, 2) == 24 + 14);
}

TEST_CASE("every element is owned by exactly one rank, at any world size", "[zero]") {
  for (int world = 1; world <= 5; ++world) {
    for (int64_t block : {1, 6, 9, 1000}) {
      const FlatLayout l = make_flat_layout(sample_params(), world, block);
      std::vector<int> owners(static_cast<size_t>(l.numel), 0);
      for (size_t b = 0; b < l.blocks.size(); ++b) {
        for (int r = 0; r < world; ++r) {
          for (int64_t i = 0; i < l.blocks[b].chunk; ++i) {
            ++owners[static_cast<size_t>(l.chunk_offset(static_cast<int64_t>(b), r) + i)];
          }
        }
      }
      for (int o : owners) REQUIRE(o == 1);
      for (const FlatLayout::Param& p : l.params) {
        const FlatLayout::Block& b = l.blocks[p.block];
        REQUIRE(p.offset >= b.offset);
        REQUIRE(p.offset + p.numel <= b.offset + b.numel);
      }
    }
  }
}

TEST_CASE("shard and unshard are inverse at every world size", "[zero]") {
  std::vector<std::pair<std::string, Tensor>> whole;
  int64_t next = 1;
  for (const FlatParamInfo& p : sample_params()) {
    const Tensor t = empty(p.shape);
    float* d = t.data_ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<float>(next++);
    whole.emplace_back(p.name, t);
  }
  for (int world = 1; world <= 4; ++world) {
    const FlatLayout l = make_flat_layout(sample_params(), world, 7);
    std::vector<Tensor> shards;
    for (int r = 0; r < world; ++r) shards.push_back(shard(l, r, whole));
    // Each shard element is a parameter element or padding (0); all of them appear once.
    double sum = 0;
    for (const Tensor& s : shards) {
      REQUIRE(s.numel() == l.shard_numel());
      for (float v : s.to_vector<float>()) sum += v;
    }
    CHECK(sum == static_cast<double>((next - 1) * next / 2));
    const auto back = unshard(l, shards);
    REQUIRE(back.size() == whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      CHECK(back[i].first == whole[i].first);
      CHECK(back[i].second.shape() == whole[i].second.shape());
      CHECK(back[i].second.to_vector<float>() == whole[i].second.to_vector<float>());
    }
    // Through another world size: unshard at `world`, shard at 3, unshard again.
    const FlatLayout l3 = make_flat_layout(sample_params(), 3, 5);
    std::vector<Tensor> shards3;
    for (int r = 0; r < 3; ++r) shards3.push_back(shard(l3, r, back));
    const auto again = unshard(l3, shards3);
    for (size_t i = 0; i < whole.size(); ++i) {
      CHECK(again[i].second.to_vector<float>() == whole[i].second.to_vector<float>());
    }
  }
}

TEST_CASE("the layout survives JSON, and bad input is named", "[zero]") {
  const FlatLayout l = make_flat_layout(sample_params(), 3, 8);
  const FlatLayout back = FlatLayout::from_json(l.to_json(), "state.json");
  CHECK(back.to_json() == l.to_json());
  CHECK(back.numel == l.numel);
  CHECK(back.blocks.size() == l.blocks.size());
  CHECK(error_of([] {
          make_flat_layout({{"x", {2}, 1}, {"y", {2}, 0}}, 2, 8);
        }) ==
        "[zero layout] parameter \"y\" of group 0 follows one of group 1; expected "
        "parameters in group order");
  CHECK(error_of([&] {
          unshard(l, {zeros({15}), zeros({15})});
        }) == "[zero unshard] expected 3 shards (the layout's world size), found 2");
  CHECK(error_of([&] {
          unshard(l, {zeros({15}), zeros({15}), zeros({14})});
        }) == "[zero unshard] shard 2: expected f32 (15), found Tensor(f32, cpu, (14))");
  CHECK(error_of([&] {
          shard(l, 0, {{"a", zeros({5})}});
        }) == "[zero shard] expected a tensor for parameter \"b\", found none");
}

}  // namespace
}  // namespace tessera::parallel
