#include "tools/data/loader.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/test_files.h"
#include "tests/testing.h"
#include "tools/data/shard.h"

using Catch::Matchers::Contains;
using tessera::data::Batch;
using tessera::data::DataLoader;
using tessera::data::LoaderMode;
using tessera::data::LoaderOptions;
using tessera::data::LoaderState;
using tessera::testing::error_of;
using tessera::testing::fresh_dir;

namespace {

// Shards whose tokens are their global positions: shard s holds sizes[0] + ... + sizes[s-1],
// then the next sizes[s] values, so every token names where it came from.
std::string write_counting_shards(const std::string& name, const std::vector<int>& sizes) {
  const auto dir = fresh_dir(name);
  uint16_t next = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<uint16_t> tokens(sizes[s]);
    for (uint16_t& t : tokens) t = next++;
    tessera::data::write_shard((dir / ("train_00000" + std::to_string(s) + ".bin")).string(),
                               tokens);
  }
  return (dir / "train_*.bin").string();
}

LoaderOptions options(int64_t B, int64_t T, LoaderMode mode = LoaderMode::kSequential) {
  LoaderOptions o;
  o.batch_size = B;
  o.seq_len = T;
  o.mode = mode;
  o.seed = 1234;
  return o;
}

std::vector<int32_t> values(const Batch& b, bool targets = false) {
  return (targets ? b.targets : b.inputs).to_vector<int32_t>();
}

// Every row of targets is its row of inputs moved on by one token (consecutive values).
void check_shifted(const Batch& b) {
  const int64_t B = b.inputs.size(0);
  const int64_t T = b.inputs.size(1);
  const std::vector<int32_t> in = values(b);
  const std::vector<int32_t> tg = values(b, true);
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      REQUIRE(tg[r * T + t] == in[r * T + t] + 1);
      if (t + 1 < T) REQUIRE(tg[r * T + t] == in[r * T + t + 1]);
    }
  }
}

}  // namespace

TEST_CASE("sequential batches walk the shards in order, targets shifted by one", "[loader]") {
  // 2 shards of 100 tokens, B*T = 24: 4 batches per shard ((100 - 1) / 24).
  const std::string pattern = write_counting_shards("loader_seq", {100, 100});
  DataLoader loader(pattern, options(2, 12));
  CHECK(loader.shards().size() == 2);
  CHECK(loader.tokens_per_batch() == 24);
  const Batch first = loader.next();
  CHECK(first.inputs.dtype() == tessera::DType::i32);
  CHECK(first.inputs.shape() == tessera::Shape{2, 12});
  CHECK(first.targets.shape() == tessera::Shape{2, 12});
  CHECK(values(first)[0] == 0);
  CHECK(values(first)[12] == 12);
  CHECK(values(first, true)[23] == 24);
  check_shifted(first);
  std::vector<int32_t> starts = {values(first)[0]};
  for (int i = 0; i < 8; ++i) {
    const Batch b = loader.next();
    check_shifted(b);
    starts.push_back(values(b)[0]);
  }
  CHECK(starts == std::vector<int32_t>{0, 24, 48, 72, 100, 124, 148, 172, 0});
  CHECK(loader.epoch() == 1);
}

TEST_CASE("ranks take disjoint chunks of each group in sequential mode", "[loader]") {
  const std::string pattern = write_counting_shards("loader_ranks", {500, 301, 450});
  constexpr int kWorld = 3;
  std::vector<DataLoader> loaders;
  for (int r = 0; r < kWorld; ++r) {
    LoaderOptions o = options(2, 8);
    o.rank = r;
    o.world_size = kWorld;
    loaders.emplace_back(pattern, o);
  }
  const int32_t shard_start[] = {0, 500, 801};
  std::set<int32_t> seen;
  int64_t tokens = 0;
  while (loaders[0].epoch() == 0) {
    for (int r = 0; r < kWorld; ++r) {
      const LoaderState at = loaders[r].state();
      const Batch b = loaders[r].next();
      check_shifted(b);
      // Rank r reads the r-th B*T chunk of the group at the cursor.
      REQUIRE(values(b)[0] == shard_start[at.shard] + at.position + r * 16);
      for (int32_t v : values(b)) seen.insert(v);
      tokens += 16;
    }
    for (int r = 1; r < kWorld; ++r) REQUIRE(loaders[r].state() == loaders[0].state());
  }
  CHECK(static_cast<int64_t>(seen.size()) == tokens);  // no token read twice
  // (500 - 1) / 48 + (301 - 1) / 48 + (450 - 1) / 48 = 10 + 6 + 9 groups of 48 tokens.
  CHECK(tokens == 25 * 48);
}

TEST_CASE("random batches are a function of the seed, the step and the rank", "[loader]") {
  const std::string pattern = write_counting_shards("loader_random", {1000, 700});
  LoaderOptions o = options(4, 16, LoaderMode::kRandom);
  DataLoader a(pattern, o);
  DataLoader b(pattern, o);
  o.seed = 99;
  DataLoader other_seed(pattern, o);
  o.seed = 1234;
  o.rank = 1;
  o.world_size = 2;
  DataLoader other_rank(pattern, o);
  int differ_seed = 0, differ_rank = 0;
  for (int i = 0; i < 40; ++i) {
    const Batch x = a.next();
    const Batch y = b.next();
    check_shifted(x);
    REQUIRE(values(x) == values(y));
    REQUIRE(values(x, true) == values(y, true));
    differ_seed += values(x) != values(other_seed.next());
    differ_rank += values(x) != values(other_rank.next());
  }
  CHECK(differ_seed == 40);
  CHECK(differ_rank == 40);
  // An epoch is 25 batches: (1000 - 1) / 64 = 15 from the first shard, (700 - 1) / 64 = 10
  // from the second.
  CHECK(a.epoch() == 1);
  CHECK(a.state() == LoaderState{1, 0, 1, 40});  // 40 = 25 + 15: on to the second shard
}

TEST_CASE("random rows stay inside the current shard", "[loader]") {
  const std::string pattern = write_counting_shards("loader_random_bounds", {200, 100});
  DataLoader loader(pattern, options(3, 10, LoaderMode::kRandom));
  for (int i = 0; i < 60; ++i) {
    const int64_t shard = loader.state().shard;
    const Batch b = loader.next();
    check_shifted(b);
    const int32_t lo = shard == 0 ? 0 : 200;
    const int32_t hi = shard == 0 ? 200 : 300;
    for (int32_t v : values(b, true)) REQUIRE((v > lo && v < hi));
  }
}

TEST_CASE("restore() continues exactly where the saved cursor was", "[loader]") {
  const std::string pattern = write_counting_shards("loader_restore", {300, 260, 281});
  for (LoaderMode mode : {LoaderMode::kSequential, LoaderMode::kRandom}) {
    LoaderOptions o = options(2, 10, mode);
    o.world_size = 2;
    o.rank = 1;
    DataLoader original(pattern, o);
    for (int saved_at : {0, 5, 13, 31}) {
      original.reset();
      for (int i = 0; i < saved_at; ++i) original.next();
      const LoaderState state = original.state();
      CHECK(state.step == saved_at);
      const LoaderState round_trip =
          LoaderState::from_json(nlohmann::json::parse(state.to_json().dump()));
      REQUIRE(round_trip == state);

      DataLoader resumed(pattern, o);
      resumed.restore(round_trip);
      for (int i = 0; i < 25; ++i) {
        const Batch x = original.next();
        const Batch y = resumed.next();
        REQUIRE(values(x) == values(y));
        REQUIRE(values(x, true) == values(y, true));
        REQUIRE(original.state() == resumed.state());
      }
      CHECK(resumed.epoch() == original.epoch());
    }
  }
}

TEST_CASE("reset() starts over", "[loader]") {
  const std::string pattern = write_counting_shards("loader_reset", {100});
  DataLoader loader(pattern, options(1, 8));
  const std::vector<int32_t> first = values(loader.next());
  loader.next();
  loader.reset();
  CHECK(loader.state() == LoaderState{});
  CHECK(values(loader.next()) == first);
}

TEST_CASE("DataLoader rejects bad options, small shards and out-of-vocabulary tokens", "[loader]") {
  const std::string pattern = write_counting_shards("loader_errors", {100, 40});
  CHECK_THAT(error_of([&] { DataLoader d(pattern + ".none", options(1, 8)); }),
             Contains("expected at least one file matching \"" + pattern + ".none\", found none"));
  CHECK_THAT(error_of([&] { DataLoader d(pattern, options(4, 16)); }),
             Contains("train_000001.bin\": expected at least 65 tokens (B*T*world_size + 1 with "
                      "B=4, T=16, world_size=1), found 40"));
  CHECK_THAT(error_of([&] { DataLoader d(pattern, options(4, 16, LoaderMode::kRandom)); }),
             Contains("train_000001.bin\": expected at least 65 tokens (B*T + 1 with B=4, "
                      "T=16), found 40"));
  LoaderOptions o = options(2, 8);
  o.world_size = 2;
  o.rank = 2;
  CHECK(error_of([&] { DataLoader d(pattern, o); }) == "[loader] rank expected in [0, 2), found 2");
  o = options(0, 8);
  CHECK(error_of([&] { DataLoader d(pattern, o); }) ==
        "[loader] batch_size expected >= 1, found 0");
  o = options(2, 8);
  o.vocab_size = 120;
  DataLoader late(pattern, o);              // shard 0 holds tokens 0..99, shard 1 100..139
  for (int i = 0; i < 6; ++i) late.next();  // (100 - 1) / 16 batches from shard 0
  CHECK(late.state() == LoaderState{1, 0, 0, 6});
  const std::string shard1 = late.shards()[1];
  CHECK(error_of([&] { late.next(); }) ==
        "[shard] \"" + shard1 +
            "\": token 20 (byte offset 1064) expected < vocab size 120, found 120");
  CHECK(late.state() == LoaderState{1, 0, 0, 6});  // the failed call left the cursor alone
  o.vocab_size = 50;
  CHECK_THAT(error_of([&] { DataLoader d(pattern, o); }),
             Contains("token 50 (byte offset 1124) expected < vocab size 50, found 50"));
}

TEST_CASE("LoaderState reads its JSON strictly", "[loader]") {
  const LoaderState s{2, 480, 3, 77};
  CHECK(s.to_json() == nlohmann::json::parse(R"({"shard":2,"position":480,"epoch":3,"step":77})"));
  CHECK(LoaderState::from_json(s.to_json()) == s);
  CHECK_THAT(error_of([] {
               LoaderState::from_json(nlohmann::json::parse(
                   R"({"shard":0,"position":0,"epoch":0,"step":0,"rank":1})"));
             }),
             Contains("unknown key loader state: $.rank"));
  CHECK_THAT(error_of([] {
               LoaderState::from_json(
                   nlohmann::json::parse(R"({"shard":0,"position":-1,"epoch":0,"step":0})"));
             }),
             Contains("$.position: expected an integer >= 0, found -1"));
  CHECK_THAT(error_of([] {
               LoaderState::from_json(nlohmann::json::parse(R"({"shard":0,"position":0})"));
             }),
             Contains("$.epoch: required key missing"));

  const std::string pattern = write_counting_shards("loader_state_errors", {100});
  DataLoader loader(pattern, options(1, 8));
  CHECK(error_of([&] {
          loader.restore({1, 0, 0, 0});
        }) == "[loader] restore: shard expected in [0, 1), found 1");
  CHECK_THAT(error_of([&] {
               loader.restore({0, 101, 0, 0});
             }),
             Contains("restore: position expected <= 100"));
}
