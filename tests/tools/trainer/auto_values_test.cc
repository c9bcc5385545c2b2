// DeepSpeed's "auto" values filled from Tessera's sections by transformers' rules (Note
// ["auto" values] in tools/trainer/auto_values.h), and the client optimizer and scheduler
// in $.trainer that stand in for the objects a Megatron-LM or Hugging Face run hands
// DeepSpeed.
#include "tools/trainer/auto_values.h"

#include <catch2/catch.hpp>

#include "core/json.h"
#include "tests/testing.h"
#include "tests/tools/trainer/run_config_edits.h"

namespace tessera::train {
namespace {

using Catch::Contains;
using Json = nlohmann::json;
using testing::base_config;
using testing::error_after;
using testing::parse;

// base_config() as Hugging Face's ZeRO-2 template (docs' ds_config_zero2.json): every value
// the Trainer owns is "auto", and $.trainer carries the TrainingArguments' part.
Json hf_template() {
  Json doc = base_config();
  for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu",
                          "gradient_accumulation_steps", "gradient_clipping"})
    doc[key] = "auto";
  doc["optimizer"] = {
      {"type", "AdamW"},
      {"params", {{"lr", "auto"}, {"betas", "auto"}, {"eps", "auto"}, {"weight_decay", "auto"}}}};
  doc["scheduler"] = {{"type", "WarmupDecayLR"},
                      {"params",
                       {{"warmup_min_lr", "auto"},
                        {"warmup_max_lr", "auto"},
                        {"warmup_num_steps", "auto"},
                        {"total_num_steps", "auto"}}}};
  doc["fp16"] = {{"enabled", "auto"}, {"loss_scale", 0}, {"initial_scale_power", 16}};
  doc["bf16"] = {{"enabled", "auto"}};
  doc["zero_optimization"] = {{"stage", 2},
                              {"overlap_comm", true},
                              {"reduce_bucket_size", "auto"},
                              {"contiguous_gradients", true}};
  Json& t = doc["trainer"];
  t["steps"] = 200;
  t["per_device_train_batch_size"] = 3;
  t["gradient_accumulation_steps"] = 2;
  t["max_grad_norm"] = 0.5;
  t["warmup_steps"] = 0.1;
  t["mixed_precision"] = "no";
  t["optimizer"] = {
      {"type", "adamw"},
      {"params", {{"lr", 5e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-6}, {"weight_decay", 0.01}}}};
  return doc;
}

TEST_CASE("Hugging Face's auto values are filled from the trainer section", "[run_config]") {
  const RunConfig c = parse(hf_template(), 2);
  CHECK(c.engine.batch.train_micro_batch_size_per_gpu == 3);
  CHECK(c.engine.batch.gradient_accumulation_steps == 2);
  CHECK(c.engine.batch.train_batch_size == 12);  // 2 ranks x 3 x 2
  CHECK(c.engine.gradient_clipping == 0.5);
  CHECK(c.engine.optimizer.lr == 5e-4);
  CHECK(c.engine.optimizer.adam.beta2 == 0.95);
  CHECK(c.engine.optimizer.adam.eps == 1e-6);
  CHECK(c.engine.optimizer.weight_decay == 0.01);
  // WarmupDecayLR from 0 to the lr over ceil(0.1 x 200) = 20 steps, then down to 0 at 200.
  CHECK(c.engine.scheduler->lr_at(0) == 0.0);
  CHECK(c.engine.scheduler->lr_at(20) == Approx(5e-4));
  CHECK(c.engine.scheduler->lr_at(200) == Approx(0.0).margin(1e-12));
  CHECK(c.engine.mixed_precision.dtype == DType::f32);
  CHECK(c.engine.zero.reduce_bucket_size == 128 * 128);
  // Every filled value is logged with its source.
  CHECK(c.auto_filled.size() == 16);
  CHECK(c.auto_filled[2] ==
        "$.train_batch_size: \"auto\" -> 12 from 2 data-parallel rank(s) x micro-batch 3 x "
        "accumulation 2");
  CHECK(c.auto_filled[11] ==
        "$.scheduler.params.warmup_num_steps: \"auto\" -> 20 from $.trainer.warmup_steps 0.1");
}

TEST_CASE("the client optimizer's other params join the template's", "[run_config]") {
  Json doc = hf_template();
  doc["trainer"]["optimizer"]["params"]["bias_correction"] = false;
  CHECK_FALSE(parse(doc).engine.optimizer.adam.bias_correction);
  // Nothing of the client section is dropped: a misspelt key is still an error.
  doc["trainer"]["optimizer"]["params"]["weight_decai"] = 0.1;
  CHECK_THAT(testing::error_of([&] { parse(doc); }),
             Contains("unknown key $.optimizer.params.weight_decai; did you mean "
                      "\"weight_decay\"?"));
}

TEST_CASE("the zero-3 template's width-based sizes follow the model", "[run_config]") {
  Json doc = hf_template();
  doc["zero_optimization"] = {{"stage", 3},
                              {"reduce_bucket_size", "auto"},
                              {"stage3_prefetch_bucket_size", "auto"},
                              {"stage3_param_persistence_threshold", "auto"},
                              {"stage3_gather_16bit_weights_on_model_save", "auto"},
                              {"offload_optimizer", {{"device", "auto"}}}};
  doc["trainer"]["mixed_precision"] = "bf16";
  doc.erase("bf16");  // accelerate adds the chosen dtype's section
  const RunConfig c = parse(doc);
  CHECK(c.engine.zero.stage == 3);
  CHECK(c.engine.zero.stage3_prefetch_bucket_size == 14745);  // int(0.9 x 128 x 128)
  CHECK(c.engine.zero.stage3_param_persistence_threshold == 1280);
  CHECK(c.engine.mixed_precision.dtype == DType::bf16);
}

TEST_CASE("every auto problem is reported at once", "[run_config]") {
  const std::string e = error_after([](Json& doc) {
    doc = hf_template();
    Json& t = doc["trainer"];
    t.erase("per_device_train_batch_size");
    t.erase("optimizer");
    t.erase("mixed_precision");
    doc["steps_per_print"] = "auto";
  });
  CHECK_THAT(e, Contains("[config] 10 problems with the config's values:\n"));
  CHECK_THAT(e, Contains("\n  $.train_micro_batch_size_per_gpu is \"auto\" and nothing here fills "
                         "it; expected a value, or $.trainer.per_device_train_batch_size\n"));
  CHECK_THAT(e, Contains("\n  $.optimizer.params.eps is \"auto\" and nothing here fills it; "
                         "expected a value, or $.trainer.optimizer.params.eps\n"));
  CHECK_THAT(e, Contains("\n  $.bf16.enabled is \"auto\" and nothing here fills it"));
  CHECK_THAT(e, Contains("\n  $.steps_per_print is \"auto\", which Tessera fills only where "
                         "Hugging Face's integration does"));
  CHECK_THAT(e, Contains("\n\"auto\" is Hugging Face's placeholder"));
}

TEST_CASE("a source of the wrong kind is named in the hint", "[run_config]") {
  CHECK_THAT(error_after([](Json& doc) {
               doc = hf_template();
               doc["trainer"]["per_device_train_batch_size"] = "4";
             }),
             Contains("$.train_micro_batch_size_per_gpu is \"auto\" and nothing here fills it; "
                      "expected a value, or $.trainer.per_device_train_batch_size as an integer "
                      ">= 1 (found string \"4\")"));
  CHECK_THAT(
      error_after([](Json& doc) {
        doc = hf_template();
        doc["scheduler"]["params"].erase("warmup_num_steps");
      }),
      Contains("$.trainer.warmup_steps fills $.scheduler.params.warmup_num_steps; expected a "
               "scheduler section with that key, found one without it"));
}

TEST_CASE("a concrete value must match its Tessera source", "[run_config]") {
  const std::string e = error_after([](Json& doc) {
    doc = hf_template();
    doc["gradient_clipping"] = 1.0;
    doc["optimizer"]["params"]["lr"] = 1e-3;
    doc["optimizer"]["type"] = "Lamb";
  });
  CHECK_THAT(e, Contains("[config] 3 problems"));
  CHECK_THAT(e, Contains("$.gradient_clipping is 1.0 but $.trainer.max_grad_norm gives 0.5; "
                         "expected the same value, or \"auto\" (Hugging Face's mismatch check)"));
  CHECK_THAT(e, Contains("$.optimizer.params.lr is 0.001 but $.trainer.optimizer.params.lr "
                         "gives 0.0005"));
  CHECK_THAT(e, Contains("$.optimizer.type is \"Lamb\" but $.trainer.optimizer.type is "
                         "\"adamw\"; expected the same type"));
}

TEST_CASE("Tessera's sources fill absent keys rather than being ignored", "[run_config]") {
  Json doc = base_config();
  doc.erase("train_micro_batch_size_per_gpu");
  doc.erase("gradient_accumulation_steps");
  doc.erase("gradient_clipping");
  doc["train_batch_size"] = 8;
  doc["trainer"]["per_device_train_batch_size"] = 4;
  doc["trainer"]["gradient_accumulation_steps"] = 2;
  doc["trainer"]["max_grad_norm"] = 0.25;
  doc["trainer"]["mixed_precision"] = "bf16";
  const RunConfig c = parse(doc);
  CHECK(c.engine.batch.train_micro_batch_size_per_gpu == 4);
  CHECK(c.engine.batch.gradient_accumulation_steps == 2);
  CHECK(c.engine.gradient_clipping == 0.25);
  CHECK(c.engine.mixed_precision.dtype == DType::bf16);
  CHECK(c.auto_filled.front() ==
        "$.train_micro_batch_size_per_gpu: absent -> 4 from $.trainer.per_device_train_batch_size");
  // A warmup with no scheduler key to fill is an error, not a key read and dropped.
  CHECK_THAT(error_after([](Json& d) {
               d["trainer"]["warmup_steps"] = 10;
               d.erase("scheduler");
             }),
             Contains("$.trainer.warmup_steps fills $.scheduler.params.warmup_num_steps; expected "
                      "a scheduler section with that key, found none"));
}

TEST_CASE("pipeline.stages \"auto\" is one stage", "[run_config]") {
  const RunConfig c = testing::parse_edited([](Json& d) { d["pipeline"] = {{"stages", "auto"}}; });
  CHECK(c.engine.pipeline.stages == 1);
  REQUIRE(c.auto_filled.size() == 1);
  CHECK_THAT(c.auto_filled[0], Contains("$.pipeline.stages: \"auto\" -> 1"));
}

TEST_CASE("the optimizer and schedule come from the client sections", "[run_config]") {
  // Megatron-style: no DeepSpeed optimizer or scheduler section.
  const RunConfig c = testing::parse_edited([](Json& d) {
    d["trainer"]["optimizer"] = d["optimizer"];
    d["trainer"]["scheduler"] = d["scheduler"];
    d["trainer"]["optimizer"]["params"]["lr"] = 3e-4;
    d.erase("optimizer");
    d.erase("scheduler");
  });
  CHECK(c.engine.optimizer.lr == 3e-4);
  CHECK(c.engine.optimizer.weight_decay == 0.1);
  CHECK(c.engine.scheduler->lr_at(1999) == Approx(3e-5));
  CHECK(error_after([](Json& d) { d["trainer"]["optimizer"] = d["optimizer"]; }) ==
        "[config] $.optimizer and $.trainer.optimizer are both given: DeepSpeed's section is for "
        "a run without a client optimizer, and $.trainer.optimizer is Tessera's client "
        "optimizer; expected one of them");
  CHECK_THAT(error_after([](Json& d) { d["trainer"]["scheduler"] = d["scheduler"]; }),
             Contains("$.scheduler and $.trainer.scheduler are both given"));
  CHECK_THAT(error_after([](Json& d) { d.erase("optimizer"); }),
             Contains("$.optimizer: required section missing; expected {\"type\": \"AdamW\", "
                      "\"params\": {...}} there or, as a Megatron-LM or Hugging Face config "
                      "leaves it to its framework, in $.trainer.optimizer"));
  // The client optimizer's keys are checked like DeepSpeed's.
  CHECK_THAT(error_after([](Json& d) {
               d["trainer"]["optimizer"] = d["optimizer"];
               d.erase("optimizer");
               d["trainer"]["optimizer"]["params"]["betas"] = {0.9, 1.5};
             }),
             Contains("$.trainer.optimizer.params.betas"));
}

}  // namespace
}  // namespace tessera::train
