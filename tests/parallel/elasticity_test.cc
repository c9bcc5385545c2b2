// DeepSpeed's elasticity (Note [Elastic batch] in parallel/elasticity.h) against the vectors
// of DeepSpeed's own tests (tests/unit/elasticity/test_elastic.py), and through the engine
// config: the elastic batch replaces the batch keys at each valid world size.
#include "parallel/elasticity.h"

#include <functional>

#include "core/json.h"
#include "parallel/engine_config.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using Catch::Contains;
using Json = nlohmann::json;

ElasticityConfig read(const Json& section) {
  const Json doc = {{"elasticity", section}};
  JsonObjectReader root(doc, "config");
  ElasticityConfig c = ElasticityConfig::from_json(root.object("elasticity"));
  root.finish();
  return c;
}

// DeepSpeed's fixture: max 10000, micro-batches [8, 12, 16, 17], 32 to 1500 GPUs.
Json fixture() {
  return {{"enabled", true},
          {"max_train_batch_size", 10000},
          {"micro_batch_sizes", {8, 12, 16, 17}},
          {"min_gpus", 32},
          {"max_gpus", 1500},
          {"min_time", 20},
          {"version", 0.1}};
}

TEST_CASE("version 0.1 finds DeepSpeed's batch and world sizes", "[elasticity]") {
  const ElasticityConfig c = read(fixture());
  const ElasticBatch b = elastic_batch(c, 64);
  CHECK(b.train_batch_size == 9792);  // 816 (the LCM) x 12
  CHECK(b.valid_world_sizes == std::vector<int64_t>{32,  34,  36,  48,  51,  64,  68,  72,
                                                    96,  102, 136, 144, 153, 192, 204, 272,
                                                    288, 306, 408, 576, 612, 816, 1224});
  CHECK(elastic_micro_batch(c, b, 64) == 17);  // 9792 / 64 = 153
  CHECK_THROWS_WITH(elastic_micro_batch(c, b, 128),
                    Contains("128 data-parallel ranks cannot train the elastic batch of 9792"));
}

TEST_CASE("an LCM above the maximum is kept, and ties go to the larger batch", "[elasticity]") {
  const ElasticityConfig c = read({{"enabled", true},
                                   {"max_train_batch_size", 32},
                                   {"micro_batch_sizes", {1, 2, 3, 7}},
                                   {"version", 0.1}});
  const ElasticBatch b = elastic_batch(c, 7);
  CHECK(b.train_batch_size == 42);  // 24 and 42 both have 8 valid sizes
  CHECK(b.valid_world_sizes == std::vector<int64_t>{1, 2, 3, 6, 7, 14, 21, 42});
  CHECK(elastic_micro_batch(c, b, 7) == 3);
  Json smaller = {{"enabled", true},
                  {"max_train_batch_size", 32},
                  {"micro_batch_sizes", {1, 2, 3, 7}},
                  {"prefer_larger_batch", false},
                  {"version", 0.1}};
  CHECK(elastic_batch(read(smaller), 7).train_batch_size == 24);
}

TEST_CASE("version 0.2 searches whole nodes", "[elasticity]") {
  Json v2 = fixture();
  v2["version"] = 0.2;
  v2["model_parallel_size"] = 4;
  v2["num_gpus_per_node"] = 8;
  const ElasticBatch b = elastic_batch(read(v2), 8);  // 2 data-parallel ranks a node
  CHECK(b.train_batch_size == 8640);                  // 4320 over nodes, x 2
  REQUIRE(b.valid_world_sizes.size() == 24);
  CHECK(b.valid_world_sizes.front() == 8);
  CHECK(b.valid_world_sizes[1] == 10);
  CHECK(b.valid_world_sizes.back() == 360);
  // 7 ranks are not among them: DeepSpeed's fall-back, the largest multiple of micro x 7
  // within the maximum (12 x 7 x 119 = 17 x 7 x 84 = 9996), for 7 alone.
  const ElasticityConfig c = read(v2);
  const ElasticBatch seven = elastic_batch(c, 7);
  CHECK(seven.train_batch_size == 9996);
  CHECK(seven.valid_world_sizes == std::vector<int64_t>{7});
  CHECK(elastic_micro_batch(c, seven, 7) == 17);  // 1428 a rank: 12 and 17 divide it
}

TEST_CASE("the elasticity section is checked as DeepSpeed checks it", "[elasticity]") {
  CHECK_THROWS_WITH(read({{"enabled", true}, {"micro_batch_sizes", {2}}}),
                    Contains("max_train_batch_size"));
  CHECK_THROWS_WITH(read({{"enabled", true}, {"max_train_batch_size", 8}}),
                    Contains("micro_batch_sizes"));
  Json bad = fixture();
  bad["micro_batch_sizes"] = {4, 0};
  CHECK_THROWS_WITH(read(bad), Contains("expected integers > 0, found 0"));
  bad = fixture();
  bad["max_gpus"] = 16;
  CHECK_THROWS_WITH(read(bad), Contains("max_gpus: expected at least min_gpus (32), found 16"));
  bad = fixture();
  bad["version"] = 0.3;
  CHECK_THROWS_WITH(read(bad), Contains("expected 0.1 or 0.2"));
  bad = fixture();
  bad["model_parallel_size"] = 2;
  CHECK_THROWS_WITH(read(bad), Contains("needs version 0.2"));
  bad = fixture();
  bad["micro_batch_sizes"] = {8, 20000};
  CHECK_THROWS_WITH(elastic_batch(read(bad), 64), Contains("20000 is larger than the maximum"));
  // Micro-batch sizes whose least common multiple does not fit 64 bits.
  bad = fixture();
  bad["max_train_batch_size"] = int64_t{1} << 40;
  bad["micro_batch_sizes"] = {97, 89, 83, 79, 73, 71, 67, 61, 59, 53, 47};
  CHECK_THROWS_WITH(elastic_batch(read(bad), 64), Contains("least common multiple overflows"));
}

// The engine config of `doc` finished for `world` ranks.
EngineConfig engine_config(const Json& doc, int64_t world) {
  JsonObjectReader root(doc, "config");
  EngineConfig c = parse_engine_config(root);
  root.finish();
  finish_engine_config(c, world);
  return c;
}

TEST_CASE("an elastic run takes the elastic batch at every valid world size", "[elasticity]") {
  // DeepSpeed's TestNonElasticBatchParamsWithOverride: max 4, micro-batches 1-4, 1-4 ranks.
  Json doc = {{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
              {"elasticity",
               {{"enabled", true},
                {"max_train_batch_size", 4},
                {"micro_batch_sizes", {1, 2, 3, 4}},
                {"min_gpus", 1},
                {"max_gpus", 4},
                {"version", 0.1}}}};
  const EngineConfig two = engine_config(doc, 2);
  CHECK(two.batch.train_batch_size == 12);  // 12 has 4 valid sizes, 4 and 3 fewer
  CHECK(two.batch.train_micro_batch_size_per_gpu == 3);
  CHECK(two.batch.gradient_accumulation_steps == 2);
  const EngineConfig four = engine_config(doc, 4);
  CHECK(four.batch.train_batch_size == 12);
  CHECK(four.batch.train_micro_batch_size_per_gpu == 3);
  CHECK(four.batch.gradient_accumulation_steps == 1);
  // The batch keys beside it are an error, unless told to be overridden.
  doc["train_batch_size"] = 4;
  CHECK_THROWS_WITH(engine_config(doc, 2), Contains("ignore_non_elastic_batch_info"));
  doc["elasticity"]["ignore_non_elastic_batch_info"] = true;
  CHECK(engine_config(doc, 2).batch.train_batch_size == 12);
  // 5 ranks are not among the valid sizes.
  CHECK_THROWS_WITH(engine_config(doc, 5),
                    Contains("expected one of the valid world sizes (1, 2, 3, 4)"));
}

}  // namespace
}  // namespace tessera::parallel
