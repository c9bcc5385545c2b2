// Progressive layer drop in training runs (Note [Progressive layer drop] in
// parallel/layer_drop.h): the draws are the same on every rank and layout, so a 2-stage
// pipeline and ZeRO-3 data parallelism (one micro-batch per rank and step) follow the
// one-process run; a checkpoint resumes it exactly (GPT and BERT); it changes the run from
// the step where theta first drops below 1; activation checkpointing is a config error.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "parallel/layer_drop.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// theta_bar 0.3, gamma 0.5: steps 0 and 1 keep every layer, step 5 keeps layer 1 with
// probability 0.70.
Json layer_drop_run(const fs::path& root, const fs::path& dir, int stage,
                    const Json& more = Json::object()) {
  Json extra = {{"progressive_layer_drop", {{"enabled", true}, {"theta", 0.3}, {"gamma", 0.5}}}};
  extra.merge_patch(more);
  return testing::run_config(root / "data", dir, stage, 6, 1000, extra);
}

TEST_CASE("layer drop follows the one-process run on a pipeline and under ZeRO-3",
          "[trainer][layer_drop]") {
  const fs::path root = testing::fresh_dir("trainer_layer_drop");
  testing::write_random_shard(root / "data", 41);
  const testing::Outcome single = testing::train(layer_drop_run(root, root / "single", 1),
                                                 root / "single", 1, ResumeMode::never);
  const testing::Outcome piped = testing::train(
      layer_drop_run(root, root / "pipe", 1,
                     {{"pipeline", {{"stages", 2}, {"partition_method", "uniform"}}}}),
      root / "pipe", 2, ResumeMode::never);
  testing::check_close(piped, single, 1e-5);

  // Three stages of one block each: the middle stage's only block may be dropped, and its
  // output is then its input.
  const Json deeper = {{"model", {{"n_layer", 3}}}};
  const testing::Outcome single3 = testing::train(layer_drop_run(root, root / "single3", 1, deeper),
                                                  root / "single3", 1, ResumeMode::never);
  Json three = deeper;
  three["pipeline"] = {{"stages", 3}, {"partition_method", "uniform"}};
  const testing::Outcome piped3 = testing::train(layer_drop_run(root, root / "pipe3", 1, three),
                                                 root / "pipe3", 3, ResumeMode::never);
  testing::check_close(piped3, single3, 1e-5);
  // It did drop it (the draws of the model's seed, the trainer's 3; 2 forwards a step).
  parallel::LayerDropConfig pld;
  pld.theta = 0.3;
  pld.gamma = 0.5;
  int drops = 0;
  for (int64_t step = 0; step < 6; ++step) {
    const double theta = parallel::layer_drop_theta_for_step(pld, step);
    for (int64_t f = 0; f < 2; ++f) {
      drops += !parallel::layer_kept(3, step, f, 1, parallel::layer_keep(1, 3, theta).probability);
    }
  }
  CHECK(drops > 0);

  // One micro-batch per rank and step, so each rank's forward k is the one process's.
  const Json one_micro = {{"gradient_accumulation_steps", 1}};
  const testing::Outcome one = testing::train(layer_drop_run(root, root / "one", 3, one_micro),
                                              root / "one", 1, ResumeMode::never);
  const testing::Outcome zero3 = testing::train(layer_drop_run(root, root / "zero3", 3, one_micro),
                                                root / "zero3", 2, ResumeMode::never);
  testing::check_close(zero3, one, 1e-5);

  // Without layer drop: the same first two steps (theta 1), then another run.
  Json plain = layer_drop_run(root, root / "plain", 1);
  plain.erase("progressive_layer_drop");
  const testing::Outcome without = testing::train(plain, root / "plain", 1, ResumeMode::never);
  CHECK(without.losses.at(1) == single.losses.at(1));
  CHECK(without.losses.at(2) == single.losses.at(2));
  CHECK(without.weights != single.weights);
}

TEST_CASE("a BERT with layer drop trains, and resumes exactly", "[trainer][layer_drop]") {
  const fs::path root = testing::fresh_dir("trainer_layer_drop_bert");
  testing::write_random_shard(root / "data", 41);
  const auto bert_run = [&](const fs::path& dir, bool drop) {
    Json doc = layer_drop_run(root, dir, 2, {{"gradient_accumulation_steps", 1}});
    doc["model"] = {{"type", "bert"}, {"vocab_size", 29}, {"block_size", 6}, {"n_layer", 3},
                    {"n_head", 2},    {"n_embd", 16},     {"dropout", 0.0}};
    if (!drop) doc.erase("progressive_layer_drop");
    return doc;
  };
  const testing::Outcome one =
      testing::train(bert_run(root / "one", true), root / "one", 1, ResumeMode::never);
  // (Its masked-LM masks follow the micro-batches, so another world size is another run.)
  Json first = bert_run(root / "resumed", true);
  first["trainer"]["steps"] = 3;
  testing::train(first, root / "resumed", 1, ResumeMode::never);
  testing::check_close(
      testing::train(bert_run(root / "resumed", true), root / "resumed", 1, ResumeMode::required),
      one, 0);
  const testing::Outcome plain =
      testing::train(bert_run(root / "plain", false), root / "plain", 1, ResumeMode::never);
  CHECK(plain.losses.at(2) == one.losses.at(2));  // theta is 1 for steps 0 and 1
  CHECK(plain.weights != one.weights);
}

TEST_CASE("a layer-drop run resumes exactly from its checkpoint", "[trainer][layer_drop]") {
  const fs::path root = testing::fresh_dir("trainer_layer_drop_resume");
  testing::write_random_shard(root / "data", 41);
  const testing::Outcome full =
      testing::train(layer_drop_run(root, root / "full", 1), root / "full", 1, ResumeMode::never);
  Json first = layer_drop_run(root, root / "resumed", 1);
  first["trainer"]["steps"] = 3;
  testing::train(first, root / "resumed", 1, ResumeMode::never);
  const testing::Outcome resumed = testing::train(layer_drop_run(root, root / "resumed", 1),
                                                  root / "resumed", 1, ResumeMode::required);
  testing::check_close(resumed, full, 0);
}

TEST_CASE("layer drop needs a model that skips layers and no activation checkpointing",
          "[trainer][layer_drop]") {
  const fs::path root = testing::fresh_dir("trainer_layer_drop_errors");
  Json doc = layer_drop_run(root, root / "run", 1);
  doc["model"]["checkpoint_activations"] = true;
  CHECK_THAT(testing::error_of([&] { parse_run_config(doc, "test", (root / "run").string()); }),
             Catch::StartsWith("[config] $.progressive_layer_drop: a recomputed layer would draw "
                               "its keep again"));
  doc = layer_drop_run(root, root / "run", 1);
  doc["progressive_layer_drop"].erase("gamma");
  CHECK(testing::error_of([&] { parse_run_config(doc, "test", (root / "run").string()); }) ==
        "[config] $.progressive_layer_drop.gamma: required key missing");
}

}  // namespace
}  // namespace tessera::train
