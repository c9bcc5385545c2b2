// The run config: DeepSpeed's engine keys plus the model, data and trainer sections, with
// every error one line naming the JSON path, what was expected and what was found.
#include "tools/trainer/run_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/json.h"
#include "models/gpt2/spec.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/run_config_edits.h"

namespace tessera::train {
namespace {

using Catch::Contains;
using Json = nlohmann::json;
using testing::base_config;
using testing::error_after;
using testing::error_of;
using testing::gpt;
using testing::parse;
using testing::parse_edited;

TEST_CASE("a valid config parses into every section", "[run_config]") {
  const RunConfig c = parse(base_config());
  CHECK(c.source == "run.json");
  CHECK(c.json == base_config());
  CHECK(c.engine.batch.train_batch_size == 12);
  CHECK(c.engine.batch.train_micro_batch_size_per_gpu == 12);
  CHECK(c.engine.batch.gradient_accumulation_steps == 1);
  CHECK(c.engine.steps_per_print == 100);
  CHECK(c.engine.gradient_clipping == 1.0);
  CHECK(c.engine.optimizer.type == optim::OptimizerType::adam);
  CHECK(c.engine.optimizer.lr == 1e-3);
  CHECK(c.engine.optimizer.adam.beta2 == 0.99);
  CHECK(c.engine.optimizer.weight_decay == 0.1);
  CHECK(c.engine.scheduler != nullptr);
  CHECK(c.engine.zero.stage == 0);
  REQUIRE(c.model->type() == "gpt2");
  CHECK(gpt(c).vocab_size == 65);
  CHECK(gpt(c).block_size == 64);
  CHECK(gpt(c).n_layer == 4);
  CHECK(gpt(c).n_head == 4);
  CHECK(gpt(c).n_embd == 128);
  CHECK_FALSE(c.checkpoint_activations);
  CHECK(c.init_from.empty());
  CHECK(c.data.train == ".data/shakespeare_char/train_*.bin");
  CHECK(c.data.val == ".data/shakespeare_char/val_*.bin");
  CHECK(c.data.tokenizer == ".data/shakespeare_char/tokenizer.json");  // beside the shards
  CHECK(c.data.random);
  CHECK(c.data.seq_len == 64);  // block_size
  CHECK(c.trainer.steps == 2000);
  CHECK_FALSE(c.trainer.epochs.has_value());
  CHECK(c.trainer.eval_interval == 250);
  CHECK(c.trainer.eval_batches == 20);
  CHECK(c.trainer.seed == 1337);
  CHECK(c.trainer.log_dir == ".runs/shakespeare_char");
  CHECK(c.trainer.checkpoint_dir == ".runs/shakespeare_char/checkpoints");
  CHECK(c.trainer.checkpoint_interval == 500);
  CHECK(c.trainer.keep_last == 2);
  CHECK(c.trainer.sample.tokens == 500);
  CHECK(c.trainer.sample.prompt == "\n");
  CHECK(c.trainer.sample.temperature == 0.8);
  CHECK(c.trainer.sample.top_k == 200);
  CHECK(c.warnings.empty());
}

TEST_CASE("absent optional keys take their defaults", "[run_config]") {
  const RunConfig c = parse_edited([](Json& d) {
    d.erase("steps_per_print");
    d.erase("scheduler");
    d.erase("gradient_clipping");
    d["data"].erase("sampling");
    d["data"].erase("val");
    d["trainer"] = {{"epochs", 1.5}};
  });
  CHECK(c.engine.steps_per_print == 10);  // DeepSpeed's documented default
  CHECK(c.engine.scheduler == nullptr);   // constant learning rate
  CHECK(c.engine.gradient_clipping == 0.0);
  CHECK(c.data.random);
  CHECK(c.data.val.empty());
  CHECK(c.trainer.steps == 0);
  CHECK(c.trainer.epochs == 1.5);
  CHECK(c.trainer.log_dir == ".runs/run");
  CHECK(c.trainer.checkpoint_dir == ".runs/run/checkpoints");
  CHECK(c.trainer.keep_last == 3);
  CHECK(c.trainer.sample.tokens == 0);
}

TEST_CASE("unknown keys at any depth name their path and the closest key", "[run_config]") {
  CHECK(error_after([](Json& d) {
          d["train_batch_sise"] = d["train_batch_size"];
          d.erase("train_batch_size");
        }) == "[config] unknown key $.train_batch_sise; did you mean \"train_batch_size\"?");
  CHECK(error_after([](Json& d) {
          d["optimizer"]["params"]["bettas"] = d["optimizer"]["params"]["betas"];
          d["optimizer"]["params"].erase("betas");
        }) == "[config] unknown key $.optimizer.params.bettas; did you mean \"betas\"?");
  CHECK(error_after([](Json& d) {
          d["model"]["n_layers"] = 4;
          d["model"].erase("n_layer");
        }) == "[config] unknown key $.model.n_layers; did you mean \"n_layer\"?");
  CHECK(error_after([](Json& d) {
          d["trainer"]["sample"]["topk"] = 200;
          d["trainer"]["sample"].erase("top_k");
        }) == "[config] unknown key $.trainer.sample.topk; did you mean \"top_k\"?");
  CHECK(error_after([](Json& d) {
          d["zero_optimization"] = {{"stagee", 0}};
        }) == "[config] unknown key $.zero_optimization.stagee; did you mean \"stage\"?");
  CHECK(error_after([](Json& d) { d["scheduler"]["params"]["warmup_num_step"] = 1; }) ==
        "[config] unknown key $.scheduler.params.warmup_num_step; did you mean "
        "\"warmup_num_steps\"?");
  CHECK(error_after([](Json& d) { d["data"]["sampeling"] = "random"; }) ==
        "[config] unknown key $.data.sampeling; did you mean \"sampling\"?");
  // A typo inside a section that is switched off is still caught.
  CHECK(error_after([](Json& d) {
          d["fp16"] = {{"enabled", false}, {"loss_scale_windw", 500}};
        }) == "[config] unknown key $.fp16.loss_scale_windw; did you mean \"loss_scale_window\"?");
  // Nothing close: the valid keys are listed.
  const std::string far = error_after([](Json& d) { d["trainer"]["zzzzzzzz"] = 1; });
  CHECK_THAT(far, Contains("[config] unknown key $.trainer.zzzzzzzz; valid keys: "));
  CHECK_THAT(far, Contains("checkpoint_interval"));
  CHECK_THAT(far, Contains("keep_last"));
  // Keys that are not identifiers are quoted in the path.
  CHECK_THAT(error_after([](Json& d) { d["model"]["n layer"] = 4; }),
             Contains("[config] unknown key $.model[\"n layer\"]"));
}

TEST_CASE("wrong types name the path, the expected kind and the value found", "[run_config]") {
  CHECK(error_after([](Json& d) { d["model"]["n_embd"] = "128"; }) ==
        "[config] $.model.n_embd: expected integer, found string \"128\"");
  CHECK(error_after([](Json& d) { d["model"]["n_embd"] = 128.5; }) ==
        "[config] $.model.n_embd: expected integer, found number 128.5");
  CHECK(error_after([](Json& d) { d["gradient_clipping"] = true; }) ==
        "[config] $.gradient_clipping: expected number, found boolean true");
  CHECK(error_after([](Json& d) { d["model"]["bias"] = 1; }) ==
        "[config] $.model.bias: expected boolean, found number 1");
  CHECK(error_after([](Json& d) { d["trainer"]["steps"] = nullptr; }) ==
        "[config] $.trainer.steps: expected integer, found null");
  CHECK(error_after([](Json& d) { d["train_batch_size"] = "12"; }) ==
        "[config] $.train_batch_size: expected integer, found string \"12\"");
  CHECK(error_after([](Json& d) { d["optimizer"]["params"]["betas"] = "0.9,0.99"; }) ==
        "[config] $.optimizer.params.betas: expected array, found string \"0.9,0.99\"");
  CHECK(error_after([](Json& d) {
          d["optimizer"]["params"]["betas"] = {0.9, "x"};
        }) == "[config] $.optimizer.params.betas[1]: expected number, found string \"x\"");
  CHECK(error_after([](Json& d) { d["trainer"]["sample"] = 500; }) ==
        "[config] $.trainer.sample: expected object, found number 500");
  CHECK(error_after([](Json& d) { d["model"] = Json::array(); }) ==
        "[config] $.model: expected object, found array");
  CHECK(error_after([](Json& d) {
          d["data"]["train"] = {"a.bin", "b.bin"};
        }) == "[config] $.data.train: expected string, found array");
  // Integral numbers written as floats are integers.
  CHECK(parse_edited([](Json& d) { d["trainer"]["steps"] = 2e3; }).trainer.steps == 2000);
  CHECK(error_of([] { parse(Json::array()); }) ==
        "[config] run.json: expected a JSON object at the top, found array");
}

TEST_CASE("out-of-range values and enumerations name the allowed values", "[run_config]") {
  CHECK(error_after([](Json& d) { d["model"]["dropout"] = 1.0; }) ==
        "[config] $.model.dropout: expected a number in [0, 0.99], found 1");
  CHECK(error_after([](Json& d) { d["model"]["n_layer"] = 0; }) ==
        "[config] $.model.n_layer: expected an integer in [1, 1024], found 0");
  CHECK(error_after([](Json& d) { d["steps_per_print"] = 0; }) ==
        "[config] $.steps_per_print: expected an integer >= 1, found 0");
  CHECK(error_after([](Json& d) { d["gradient_clipping"] = -1.0; }) ==
        "[config] $.gradient_clipping: expected a number in [0, 1e+30], found -1");
  CHECK(error_after([](Json& d) { d["optimizer"]["params"]["lr"] = -0.1; }) ==
        "[config] $.optimizer.params.lr: expected a number in [0, 1e+09], found -0.1");
  CHECK(error_after([](Json& d) { d["trainer"]["sample"]["top_p"] = 0.0; }) ==
        "[config] $.trainer.sample.top_p: expected a number in [1e-06, 1], found 0");
  CHECK(error_after([](Json& d) { d["trainer"]["keep_last"] = -1; }) ==
        "[config] $.trainer.keep_last: expected an integer >= 0, found -1");
  CHECK(error_after([](Json& d) { d["trainer"]["steps"] = 0; }) ==
        "[config] $.trainer.steps: expected an integer >= 1, found 0");
  CHECK(error_after([](Json& d) {
          d["trainer"].erase("steps");
          d["trainer"]["epochs"] = 0;
        }) == "[config] $.trainer.epochs: expected a number > 0, found 0");
  CHECK(error_after([](Json& d) { d["data"]["seq_len"] = 65; }) ==
        "[config] $.data.seq_len: expected an integer in [1, 64], found 65");
  CHECK(error_after([](Json& d) {
          d["zero_optimization"] = {{"stage", 4}};
        }) == "[config] $.zero_optimization.stage: expected an integer in [0, 3], found 4");
  CHECK(error_after([](Json& d) { d["data"]["sampling"] = "shuffled"; }) ==
        "[config] $.data.sampling: expected one of \"random\", \"sequential\"; found "
        "\"shuffled\"");
  CHECK(error_after([](Json& d) { d["model"]["type"] = "llama"; }) ==
        "[config] $.model.type: expected one of \"gpt2\", \"bert\"; found \"llama\"");
  CHECK_THAT(error_after([](Json& d) { d["scheduler"]["type"] = "CosineLR"; }),
             Contains("[config] $.scheduler.type: expected one of \"WarmupLR\", "
                      "\"WarmupDecayLR\", \"WarmupCosineLR\", \"OneCycle\", \"LRRangeTest\"; "
                      "found \"CosineLR\""));
  CHECK(error_after([](Json& d) { d["optimizer"]["type"] = "Adagrad"; }) ==
        "[config] $.optimizer.type: expected one of Adam, AdamW, Lamb, SGD, OneBitAdam, "
        "ZeroOneAdam, OneBitLamb, found \"Adagrad\"");
  CHECK(error_after([](Json& d) {
          d["optimizer"]["params"]["betas"] = {0.9, 1.5};
        }) == "[config] $.optimizer.params.betas: expected two numbers in [0, 1), found [0.9,1.5]");
  CHECK(error_after([](Json& d) { d["optimizer"]["params"]["betas"] = {0.9}; }) ==
        "[config] $.optimizer.params.betas: expected two numbers in [0, 1), found [0.9]");
}

TEST_CASE("the batch triple is derived and checked with DeepSpeed's messages", "[run_config]") {
  const auto batch = [](std::optional<int64_t> tbs, std::optional<int64_t> mbs,
                        std::optional<int64_t> gas) {
    return parse_edited([&](Json& d) {
      d.erase("train_batch_size");
      d.erase("train_micro_batch_size_per_gpu");
      d.erase("gradient_accumulation_steps");
      if (tbs) d["train_batch_size"] = *tbs;
      if (mbs) d["train_micro_batch_size_per_gpu"] = *mbs;
      if (gas) d["gradient_accumulation_steps"] = *gas;
    });
  };
  const auto triple = [&](std::optional<int64_t> tbs, std::optional<int64_t> mbs,
                          std::optional<int64_t> gas) {
    const parallel::BatchConfig b = batch(tbs, mbs, gas).engine.batch;
    return std::vector<int64_t>{b.train_batch_size, b.train_micro_batch_size_per_gpu,
                                b.gradient_accumulation_steps};
  };
  const std::nullopt_t none = std::nullopt;
  CHECK(triple(32, none, none) == std::vector<int64_t>{32, 32, 1});  // TBS only: GAS 1
  CHECK(triple(none, 4, 8) == std::vector<int64_t>{32, 4, 8});       // MBS + GAS -> TBS
  CHECK(triple(32, 4, none) == std::vector<int64_t>{32, 4, 8});      // TBS + MBS -> GAS
  CHECK(triple(32, none, 4) == std::vector<int64_t>{32, 8, 4});      // TBS + GAS -> MBS
  CHECK(triple(none, 6, none) == std::vector<int64_t>{6, 6, 1});     // MBS only
  CHECK(triple(32, 4, 8) == std::vector<int64_t>{32, 4, 8});         // all three

  const auto error = [&](std::optional<int64_t> tbs, std::optional<int64_t> mbs,
                         std::optional<int64_t> gas) {
    return error_of([&] { batch(tbs, mbs, gas); });
  };
  CHECK(error(32, 3, 2) ==
        "[config] Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 32 != 3 * 2 * 1");
  // The derivation floors, so an indivisible batch ends in the same check.
  CHECK(error(32, 3, none) ==
        "[config] Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 32 != 3 * 10 * 1");
  CHECK(error(32, none, 5) ==
        "[config] Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 32 != 6 * 5 * 1");
  const std::string neither =
      "[config] Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided";
  CHECK(error(none, none, none) == neither);
  CHECK(error(none, none, 4) == neither);
  CHECK(error(0, none, none) == "[config] Train batch size: 0 has to be greater than 0");
  CHECK(error(8, 0, 1) == "[config] Micro batch size per gpu: 0 has to be greater than 0");
  CHECK(error(2, 4, none) == "[config] Gradient accumulation steps: 0 has to be greater than 0");
  // A given key that is not positive is named before any division by it (found by
  // tests/fuzz/config_fuzz_test: a micro-batch of 0 divided the train batch by zero).
  CHECK(error(none, -4, 2) == "[config] Micro batch size per gpu: -4 has to be greater than 0");
  CHECK(error(4, 0, none) == "[config] Micro batch size per gpu: 0 has to be greater than 0");
  CHECK(error(4, none, 0) == "[config] Gradient accumulation steps: 0 has to be greater than 0");
  CHECK(error(none, int64_t{1} << 62, 4) ==
        "[config] micro_batch_per_gpu * gradient_acc_step * world_size overflows: "
        "4611686018427387904 * 4 * 1");
  CHECK(error_after([](Json& d) { d["gradient_accumulation_steps"] = 1.5; }) ==
        "[config] $.gradient_accumulation_steps: expected integer, found number 1.5");
}

TEST_CASE("missing and inconsistent sections", "[run_config]") {
  CHECK(error_after([](Json& d) { d["trainer"].erase("steps"); }) ==
        "[config] $.trainer: expected exactly one of \"steps\" and \"epochs\", found neither");
  CHECK(error_after([](Json& d) { d["trainer"]["epochs"] = 2; }) ==
        "[config] $.trainer: expected exactly one of \"steps\" and \"epochs\", found both");
  CHECK(error_after([](Json& d) { d.erase("trainer"); }) ==
        "[config] $.trainer: expected exactly one of \"steps\" and \"epochs\", found neither");
  // A misspelled key is reported, not the missing key that follows from it.
  CHECK(error_after([](Json& d) {
          d["trainer"].erase("steps");
          d["trainer"]["step"] = 100;
        }) == "[config] unknown key $.trainer.step; did you mean \"steps\"?");
  CHECK(error_after([](Json& d) {
          d["trainer"].erase("steps");
          d["trainer"]["epoch"] = 2;
        }) == "[config] unknown key $.trainer.epoch; did you mean \"epochs\"?");
  CHECK(error_after([](Json& d) { d["model"]["n_embd"] = 130; }) ==
        "[config] $.model.n_embd: expected a positive multiple of n_head (4), found 130");
  // Cross-key checks run after the unknown-key check, so a typo is named as such rather
  // than as the inconsistency its default causes.
  CHECK(error_after([](Json& d) {
          d["model"].erase("n_head");
          d["model"]["n_heads"] = 4;
        }) == "[config] unknown key $.model.n_heads; did you mean \"n_head\"?");
  CHECK(error_after([](Json& d) {
          d.erase("train_batch_size");
          d.erase("train_micro_batch_size_per_gpu");
          d["train_batch_sise"] = 12;
        }) == "[config] unknown key $.train_batch_sise; did you mean \"train_batch_size\"?");
  // DeepSpeed features that have not landed are refused by name.
  CHECK_THAT(error_after([](Json& d) {
               d["data_efficiency"] = {{"enabled", true}};
             }),
             Catch::Contains("$.data_efficiency is not supported"));
  CHECK(error_after([](Json& d) { d["use_data_before_expert_parallelism"] = true; }) ==
        "[config] $.use_data_before_expert_parallelism: DeepSpeed's D+E layout of the expert "
        "groups is not built by Tessera, which builds E+D (expert groups of consecutive data "
        "ranks); expected false or absent");
  CHECK_NOTHROW(parse_edited([](Json& d) { d["use_data_before_expert_parallelism"] = false; }));
  CHECK(error_after([](Json& d) { d.erase("model"); }) == "[config] $.model: required key missing");
  CHECK(error_after([](Json& d) { d["model"].erase("type"); }) ==
        "[config] $.model.type: required key missing");
  CHECK(error_after([](Json& d) { d.erase("data"); }) == "[config] $.data: required key missing");
  CHECK(error_after([](Json& d) { d["data"].erase("train"); }) ==
        "[config] $.data.train: required key missing");
  CHECK(error_after([](Json& d) { d.erase("optimizer"); }) ==
        "[config] $.optimizer: required section missing; expected {\"type\": \"AdamW\", "
        "\"params\": {...}} there or, as a Megatron-LM or Hugging Face config leaves it to its "
        "framework, in $.trainer.optimizer");
  CHECK(error_after([](Json& d) { d["scheduler"]["params"].erase("total_num_steps"); }) ==
        "[config] $.scheduler.params.total_num_steps: required key missing");
  CHECK(error_after([](Json& d) { d["model"]["preset"] = "gpt3"; }) ==
        "[gpt2] unknown preset \"gpt3\"; expected one of gpt2, gpt2-medium, gpt2-large, "
        "gpt2-xl");
}

std::filesystem::path temp_file(const std::string& name, const std::string& text) {
  const std::filesystem::path dir = testing::temp_path("run_config_test");
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

TEST_CASE("duplicate keys in the file are errors naming the path", "[run_config]") {
  CHECK(error_of([] {
          parse_json(R"({"train_batch_size": 12, "train_batch_size": 24})", "x.json");
        }) == "[json] x.json: duplicate key \"train_batch_size\" in $ (each key may appear once)");
  CHECK(error_of([] {
          parse_json(R"({"optimizer": {"params": {"lr": 1e-3, "betas": [0.9, 0.99], "lr": 3e-4}}})",
                     "x.json");
        }) ==
        "[json] x.json: duplicate key \"lr\" in $.optimizer.params (each key may appear once)");

  std::string text = base_config().dump(2);
  text.insert(text.rfind('}'), ", \"model\": {}");
  const std::string path = temp_file("duplicate.json", text).string();
  CHECK(error_of([&] { load_run_config(path); }) ==
        "[json] " + path + ": duplicate key \"model\" in $ (each key may appear once)");
}

TEST_CASE("load_run_config reads a file and defaults the run directory to its stem",
          "[run_config]") {
  Json doc = base_config();
  doc["trainer"].erase("log_dir");
  doc["trainer"].erase("checkpoint_dir");
  const std::string path = temp_file("tiny_run.json", doc.dump(2)).string();
  const RunConfig c = load_run_config(path);
  CHECK(c.source == path);
  CHECK(c.json == doc);
  CHECK(c.trainer.log_dir == ".runs/tiny_run");
  CHECK(c.trainer.checkpoint_dir == ".runs/tiny_run/checkpoints");

  CHECK_THAT(error_of([] { load_run_config("/nonexistent/run.json"); }),
             Contains("[json] cannot open \"/nonexistent/run.json\""));
  const std::string bad = temp_file("syntax.json", "{\"train_batch_size\": 12,\n}").string();
  CHECK_THAT(error_of([&] { load_run_config(bad); }),
             Contains("[json] " + bad + ": parse error at byte 25 (line 2, column 1)"));
}

TEST_CASE("a config's problems are reported in one error", "[run_config]") {
  // Three independent mistakes in three sections: one run shows them all (Note [One pass]
  // in core/json.h), in reading order, unknown keys last.
  CHECK(error_after([](Json& d) {
          d["gradient_clipping"] = "1.0";
          d["zero_optimization"] = {{"stage", 5}};
          d["trainer"]["eval_intervall"] = 100;
          d["model"]["dropout"] = 2.0;
        }) ==
        "[config] 4 problems:\n"
        "  $.gradient_clipping: expected number, found string \"1.0\"\n"
        "  $.zero_optimization.stage: expected an integer in [0, 3], found 5\n"
        "  $.model.dropout: expected a number in [0, 0.99], found 2\n"
        "  unknown key $.trainer.eval_intervall; did you mean \"eval_interval\"?");
}

}  // namespace
}  // namespace tessera::train
