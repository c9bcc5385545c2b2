// The run config's mixed-precision keys, the features this build refuses (each with its
// reason and key), and the sparse_attention section and the bert model.
#include <catch2/catch.hpp>

#include "core/json.h"
#include "models/bert/spec.h"
#include "models/gpt2/spec.h"
#include "tests/testing.h"
#include "tests/tools/trainer/run_config_edits.h"
#include "tools/trainer/run_config.h"

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

TEST_CASE("mixed precision is read for CPU and CUDA runs, with fp16's loss-scaler keys",
          "[run_config]") {
  Json d = base_config();
  d["trainer"]["device"] = "cuda:1";
  d["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}, {"hysteresis", 3}};
  const RunConfig c = parse(d);
  CHECK(c.trainer.device == Device::cuda(1));
  CHECK(c.engine.mixed_precision.dtype == DType::f16);
  CHECK(c.engine.mixed_precision.scaler.initial_scale_power == 12);
  CHECK(c.engine.mixed_precision.scaler.hysteresis == 3);
  CHECK(c.engine.mixed_precision.scaler.window == 1000);
  d.erase("fp16");
  d["bf16"] = {{"enabled", true}};
  CHECK(parse(d).engine.mixed_precision.dtype == DType::bf16);
  d["trainer"]["device"] = "cpu";  // the CPU kernels take 16-bit tensors too
  CHECK(parse(d).engine.mixed_precision.dtype == DType::bf16);
  CHECK(parse(base_config()).engine.mixed_precision.dtype == DType::f32);
  CHECK(parse(base_config()).trainer.device == Device::cpu());
  // communication_data_type and data_types.grad_accum_dtype (DtypeEnum's names there).
  CHECK(!parse(d).engine.mixed_precision.communication.has_value());
  CHECK(parse(d).engine.mixed_precision.communication_dtype() == DType::bf16);
  CHECK(parse(d).engine.mixed_precision.accumulation_dtype(0) == DType::f32);
  d["communication_data_type"] = "fp32";
  d["data_types"] = {{"grad_accum_dtype", "bfloat16"}};
  CHECK(parse(d).engine.mixed_precision.communication_dtype() == DType::f32);
  CHECK(parse(d).engine.mixed_precision.accumulation_dtype(1) == DType::bf16);
  CHECK(error_after([](Json& j) { j["communication_data_type"] = "float16"; }) ==
        "[config] $.communication_data_type: expected \"fp32\", \"fp16\" or \"bf16\", found "
        "\"float16\"");
  CHECK(error_after([](Json& j) {
          j["data_types"] = {{"grad_accum_dtype", "int8"}};
        }) ==
        "[config] $.data_types.grad_accum_dtype: expected \"fp32\", \"fp16\" or \"bf16\" (or "
        "another name of DeepSpeed's DtypeEnum), found \"int8\"");
  CHECK(error_after([](Json& j) {
          j["bf16"] = {{"enabled", true}};
          j["data_types"] = {{"grad_accum_dtype", "fp16"}};
        }) ==
        "[config] $.data_types.grad_accum_dtype: gradients accumulate in fp32 or in the model's "
        "bf16; expected one of them, found fp16");
  CHECK(error_after([](Json& j) {
          j["bf16"] = {{"enabled", true}};
          j["communication_data_type"] = "fp16";
        }) ==
        "[config] $.communication_data_type: fp16 reductions need fp16 training's loss scaling "
        "and overflow check; expected \"fp32\" or \"bf16\" with bf16 training, found \"fp16\"");
  CHECK(error_after([](Json& j) {
          j["bf16"] = {{"enabled", true}};
          j["pipeline"] = {{"stages", 2}};
          j["data_types"] = {{"grad_accum_dtype", "fp32"}};
        }) ==
        "[config] $.data_types.grad_accum_dtype: pipeline stages sum their micro-batches' "
        "gradients in the model's bf16 (the tied embedding's copies are summed in them before "
        "the reduction); expected bf16 or no grad_accum_dtype, found fp32");
  CHECK(error_after([](Json& j) {
          j["bf16"] = {{"enabled", true}};
          j["zero_optimization"] = {{"stage", 2}};
          j["data_types"] = {{"grad_accum_dtype", "bf16"}};
        }) ==
        "[config] $.data_types.grad_accum_dtype: ZeRO stage 2 adds each micro-batch's reduced "
        "gradient into an fp32 shard; expected fp32, found bf16");
  CHECK(error_after([](Json& j) { j["trainer"]["device"] = "gpu"; }) ==
        "[config] $.trainer.device: expected \"cpu\", \"cuda\" or \"cuda:N\", found \"gpu\"");
  CHECK(error_after([](Json& j) {
          j["trainer"]["device"] = "cuda";
          j["fp16"] = {{"enabled", true}};
          j["bf16"] = {{"enabled", true}};
        }) == "[config] $.bf16.enabled: fp16 and bf16 are both enabled; expected at most one");
  // ZeRO-3 runs on CUDA as on the CPU.
  CHECK(parse_edited([](Json& j) {
          j["trainer"]["device"] = "cuda";
          j["bf16"] = {{"enabled", true}};
          j["zero_optimization"] = {{"stage", 3}};
        }).engine.zero.stage == 3);
  // So do pipelines and tensor slicing, their groups split from the device group.
  Json three_d = base_config();
  three_d["trainer"]["device"] = "cuda";
  three_d["pipeline"] = {{"stages", 2}, {"overlap_transfers", false}};
  three_d["tensor_parallel"] = {{"tp_size", 2}};
  const train::RunConfig sliced = parse(three_d, 4);
  CHECK(sliced.engine.pipeline.stages == 2);
  CHECK(sliced.engine.tensor_parallel.tp_size == 2);
  CHECK_FALSE(sliced.engine.pipeline.overlap_transfers);
  CHECK(parse(base_config()).engine.pipeline.overlap_transfers);
  CHECK(sliced.engine.tensor_parallel.batch_split == 1);
  three_d["tensor_parallel"]["batch_split"] = 2;
  CHECK(parse(three_d, 4).engine.tensor_parallel.batch_split == 2);
  three_d["tensor_parallel"]["overlap_comm"] = false;
  CHECK_THROWS_WITH(parse(three_d, 4),
                    "[config] $.tensor_parallel.batch_split: 2 pieces overlap the tensor-parallel "
                    "sums of one with another's computation; expected tp_size > 1 and "
                    "overlap_comm true, found tp_size 2 and overlap_comm false");
  CHECK(error_after([](Json& j) {
          j["tensor_parallel"] = {{"batch_split", 4}};
        }) ==
        "[config] $.tensor_parallel.batch_split: 4 pieces overlap the tensor-parallel sums of "
        "one with another's computation; expected tp_size > 1 and overlap_comm true, found "
        "tp_size 1 and overlap_comm true");
}

TEST_CASE("features this build does not have are refused, saying why", "[run_config]") {
  CHECK(error_after([](Json& d) {
          d["zero_optimization"] = {{"stage", 3},
                                    {"stage3_gather_16bit_weights_on_model_save", true}};
        }) ==
        "[config] $.zero_optimization.stage3_gather_16bit_weights_on_model_save: stage 3 "
        "checkpoints keep the weights in the ranks' shards (tools/zero_to_fp32 writes them "
        "whole); expected false");
  CHECK(error_after([](Json& d) {
          d["zero_optimization"] = {{"stage", 1}};
          d["optimizer"]["type"] = "Lamb";
        }) ==
        "[config] $.zero_optimization.stage: LAMB's trust ratio needs each parameter whole, "
        "and ZeRO stage 1 shards them; expected stage 0 with LAMB");
  CHECK(error_after([](Json& d) {
          d["zero_optimization"] = {{"stage", 2}, {"reduce_bucket_size", 2.5}};
        }) ==
        "[config] $.zero_optimization.reduce_bucket_size: expected a whole number of elements, "
        "found 2.5");
  CHECK(parse_edited([](Json& d) {
          d["zero_optimization"] = {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}};
        }).engine.zero.offload_optimizer.device == parallel::OffloadOptimizerConfig::Device::cpu);
  CHECK(error_after([](Json& d) {
          d["zero_optimization"] = {{"cpu_offload", true}};
        }) ==
        "[config] $.zero_optimization.cpu_offload: offloading the optimizer's state needs it "
        "partitioned; expected ZeRO stage 1-3, found stage 0");
  CHECK(error_after([](Json& d) {
          d["zero_optimization"] = {{"stage", 1}, {"offload_param", {{"device", "cpu"}}}};
        }) ==
        "[config] $.zero_optimization.offload_param: offloading parameters needs them "
        "partitioned; expected ZeRO stage 3, found stage 1");
  // fp16's loss-scale keys under bf16: checked, and one warning that they do nothing.
  const RunConfig copied = parse_edited([](Json& d) {
    d["bf16"] = {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 16}};
  });
  CHECK(copied.warnings ==
        std::vector<std::string>{"[config] $.bf16: loss_scale, initial_scale_power are fp16's "
                                 "loss-scaling keys; bf16 needs no loss scale, so they do nothing "
                                 "here"});
  CHECK(error_after([](Json& d) {
          d["bf16"] = {{"enabled", true}, {"hysteresis", 0}};
        }) == "[config] $.bf16.hysteresis: expected an integer >= 1, found 0");
  // DeepSpeed sections Tessera lacks: refused by name with the reason, accepted disabled.
  CHECK(error_after([](Json& d) {
          d["eigenvalue"] = {{"enabled", true}};
        }) ==
        "[config] $.eigenvalue is not supported by Tessera: eigenvalue-based quantization "
        "schedules are outside Tessera's scope; expected it absent or with \"enabled\": false");
  // Monitors (tools/trainer/monitor.h): DeepSpeed's keys, and no network services.
  CHECK(error_after([](Json& d) {
          d["wandb"] = {{"enabled", true}, {"project", "p"}, {"team", nullptr}};
        }) ==
        "[config] $.wandb needs network access; use tensorboard or csv_monitor; expected it "
        "absent or with \"enabled\": false");
  CHECK(error_after([](Json& d) {
          d["comet"] = {{"enabled", true}, {"samples_log_interval", 10}};
        }) ==
        "[config] $.comet needs network access; use tensorboard or csv_monitor; expected it "
        "absent or with \"enabled\": false");
  CHECK_THAT(error_after([](Json& d) {
               d["tensorboard"] = {{"enabled", true}, {"output_dir", "runs/"}};
             }),
             Catch::StartsWith("[config] unknown key $.tensorboard.output_dir"));
  CHECK(error_after([](Json& d) {
          d["csv_monitor"] = {{"enabled", "yes"}};
        }) == "[config] $.csv_monitor.enabled: expected boolean, found string \"yes\"");
  {
    const RunConfig c = parse_edited([](Json& d) {
      d["tensorboard"] = {{"enabled", true}, {"output_path", "runs/"}, {"job_name", "x"}};
      d["csv_monitor"] = {{"enabled", true}};
      d["wandb"] = {{"enabled", false}, {"group", nullptr}, {"team", nullptr}, {"project", "ds"}};
      d["comet"] = {{"enabled", false},
                    {"samples_log_interval", 100},
                    {"online", nullptr},
                    {"mode", nullptr},
                    {"api_key", nullptr}};
    });
    CHECK(c.monitors.tensorboard.folder("run") == "runs/x");
    CHECK(c.monitors.csv.folder("run") == "run/DeepSpeedJobName");
  }
  CHECK_NOTHROW(parse_edited([](Json& d) {
    d["tensorboard"] = {{"enabled", false}, {"output_path", "runs/"}, {"job_name", "x"}};
    d["flops_profiler"] = {{"enabled", false}, {"profile_step", 1}};
    d["aio"] = {{"block_size", 1048576}, {"queue_depth", 8}, {"single_submit", false}};
  }));
  CHECK(error_after([](Json& d) {
          d["aio"] = {{"block_size", "1M"}};
        }) == "[config] $.aio.block_size: expected integer, found string \"1M\"");
  CHECK(error_after([](Json& d) {
          d["aio"] = {{"block_size", 1000}};
        }) ==
        "[config] $.aio.block_size: direct I/O moves whole blocks of 4096 bytes; expected "
        "a multiple of it, found 1000");
  CHECK(error_after([](Json& d) {
          d["aio"] = {{"thread_count", 2}, {"intra_op_parallelism", 3}};
        }) ==
        "[config] $.aio.thread_count: the documented name of intra_op_parallelism; "
        "expected the same value, found 2 and 3");
  CHECK(parse_edited([](Json& d) {
          d["aio"] = {{"thread_count", 2}, {"queue_depth", 16}};
        }).engine.zero.aio.intra_op_parallelism == 2);
  const RunConfig averaged = parse_edited([](Json& d) {
    d["prescale_gradients"] = true;
    d["gradient_predivide_factor"] = 4.0;
  });
  CHECK(averaged.engine.zero.prescale_gradients);
  CHECK(averaged.engine.zero.gradient_predivide_factor == 4.0);
  CHECK_THAT(error_after([](Json& d) { d["gradient_predivide_factor"] = 0.0; }),
             Catch::StartsWith("[config] $.gradient_predivide_factor: "));
  CHECK(error_after([](Json& d) {
          d["optimizer"]["type"] = "OneBitAdam";
          d["zero_optimization"] = {{"stage", 1}};
        }) ==
        "[config] $.zero_optimization.stage: 1bit-Adam is not compatible with ZeRO; "
        "expected stage 0, found stage 1");
  CHECK(error_after([](Json& d) { d["optimizer"]["params"]["amsgrad"] = true; }) ==
        "[config] $.optimizer.params.amsgrad is not supported: expected false; AMSGrad is not "
        "implemented");
  CHECK(error_after([](Json& d) { d["optimizer"]["params"]["max_grad_norm"] = 1.0; }) ==
        "[config] $.optimizer.params.max_grad_norm: 'max_grad_norm' is not supported as an "
        "optimizer parameter, please switch to using the deepspeed parameter "
        "'gradient_clipping' see: https://www.deepspeed.ai/docs/config-json/#gradient-clipping "
        "for more details");
  // Disabled sections and stage 0 are accepted; bfloat16 is bf16's deprecated spelling.
  const RunConfig c = parse_edited([](Json& d) {
    d["fp16"] = {{"enabled", false}, {"loss_scale", 0}, {"initial_scale_power", 12}};
    d["bfloat16"] = {{"enabled", false}};
    d["zero_optimization"] = {{"stage", 0}};
  });
  CHECK(c.engine.zero.stage == 0);
  CHECK(c.engine.zero.overlap_comm == false);
  CHECK(c.engine.zero.reduce_bucket_size == 500'000'000);
  const RunConfig z = parse_edited([](Json& d) {
    d["zero_optimization"] = {{"stage", 2},
                              {"reduce_bucket_size", 5e7},
                              {"allgather_bucket_size", 2e7},
                              {"reduce_scatter", false}};
  });
  CHECK(z.engine.zero.stage == 2);
  CHECK(z.engine.zero.block_numel() == 20'000'000);
  CHECK(!z.engine.zero.reduce_scatter);
  REQUIRE(c.warnings.size() == 1);
  CHECK(c.warnings[0] == "[config] $.bfloat16 is deprecated; use $.bf16 instead");
}

TEST_CASE("activation_checkpointing's keys act on recomputed blocks or are refused",
          "[run_config]") {
  const Json megatron = {{"partition_activations", true},           {"cpu_checkpointing", true},
                         {"contiguous_memory_optimization", false}, {"number_checkpoints", 4},
                         {"synchronize_checkpoint_boundary", true}, {"profile", true}};
  const RunConfig c = parse_edited([&](Json& d) {
    d["activation_checkpointing"] = megatron;
    d["model"]["checkpoint_activations"] = true;
  });
  CHECK(c.engine.activation_checkpointing.partition_activations);
  CHECK(c.engine.activation_checkpointing.cpu_checkpointing);
  CHECK(c.engine.activation_checkpointing.synchronize_checkpoint_boundary);
  CHECK(c.engine.activation_checkpointing.profile);
  CHECK(error_after([&](Json& d) { d["activation_checkpointing"] = megatron; }) ==
        "[config] $.activation_checkpointing: its options act on recomputed segments, and none "
        "are recomputed; expected model.checkpoint_activations true or "
        "pipeline.activation_checkpoint_interval > 0 with them (Megatron's "
        "--checkpoint-activations)");
  // All off (DeepSpeedExamples' usual section) needs no recomputation.
  parse_edited([](Json& d) {
    d["activation_checkpointing"] = {{"partition_activations", false},
                                     {"contiguous_memory_optimization", false},
                                     {"cpu_checkpointing", false},
                                     {"number_checkpoints", nullptr}};
  });
  CHECK_THAT(error_after([](Json& d) {
               d["activation_checkpointing"] = {{"contiguous_memory_optimization", true}};
             }),
             Contains("$.activation_checkpointing.contiguous_memory_optimization is not "
                      "supported: DeepSpeed copies checkpointed activations into one "
                      "preallocated buffer"));
}

TEST_CASE("sparse_attention and the bert model", "[run_config]") {
  // GPT takes the top-level section into its model config; it must be causal.
  const RunConfig gpt = parse_edited([](Json& d) {
    d["sparse_attention"] = {{"mode", "fixed"}, {"block", 16}, {"attention", "unidirectional"}};
  });
  REQUIRE(tessera::train::gpt(gpt).sparse_attention.has_value());
  CHECK(tessera::train::gpt(gpt).sparse_attention->mode == SparsityMode::fixed);
  CHECK(gpt.model->to_json()["sparse_attention"]["mode"] == "fixed");
  CHECK(error_after([](Json& d) {
          d["sparse_attention"] = {{"mode", "bigbird"}};
        }) ==
        "[config] $.sparse_attention.attention: GPT is causal; expected \"unidirectional\" for "
        "mode \"bigbird\", found \"bidirectional\"");
  CHECK_THAT(error_after([](Json& d) {
               d["sparse_attention"] = {{"mode", "sparse"}};
             }),
             Catch::Contains("$.sparse_attention.mode"));
  CHECK_THAT(error_after([](Json& d) {
               d["sparse_attention"] = {{"mode", "fixed"},
                                        {"num_local_blocks", 4},
                                        {"num_global_blocks", 3},
                                        {"attention", "unidirectional"}};
             }),
             Catch::Contains("must be dividable by number of global blocks"));
  CHECK_THAT(
      error_after([](Json& d) {
        d["sparse_attention"] = {{"mode", "bigbird"}, {"num_local_blocks", 4}};
      }),
      Catch::Contains("$.sparse_attention.num_local_blocks is not used by mode \"bigbird\""));
  CHECK(error_after([](Json& d) {
          d["sparse_attention"] = {{"mode", "dense"}};
          d["model"]["sparse_attention"] = {{"mode", "dense"}};
        }) ==
        "[config] $.model.sparse_attention: the run has a top-level sparse_attention "
        "section; expected the layout once, found it twice");
  CHECK_THAT(error_after(
                 [](Json& d) {
                   d["sparse_attention"] = {{"mode", "fixed"},
                                            {"attention", "unidirectional"},
                                            {"different_layout_per_head", true}};
                   d["tensor_parallel"] = {{"tp_size", 2}};
                 },
                 2),
             Catch::Contains("per-head layouts under tensor slicing are not implemented"));

  // BERT: bidirectional, data parallel only, no init_from, no sampling.
  auto bert = [](Json& d) {
    d["model"] = {{"type", "bert"}, {"vocab_size", 65}, {"block_size", 64},
                  {"n_layer", 2},   {"n_head", 4},      {"n_embd", 64}};
    d["trainer"].erase("sample");
  };
  const RunConfig b = parse_edited([&](Json& d) {
    bert(d);
    d["sparse_attention"] = {{"mode", "bigbird"}, {"block", 16}};
  });
  REQUIRE(b.model->type() == "bert");
  const BertSpec& bert_spec = dynamic_cast<const BertSpec&>(*b.model);
  CHECK(bert_spec.config().n_layer == 2);
  CHECK(b.data.seq_len == 64);
  CHECK(bert_spec.sparse_attention()->mode == SparsityMode::bigbird);
  CHECK(b.model->to_json()["sparse_attention"]["mode"] == "bigbird");
  CHECK(error_after([&](Json& d) {
          bert(d);
          d["sparse_attention"] = {{"mode", "fixed"}, {"attention", "unidirectional"}};
        }) ==
        "[config] $.sparse_attention.attention: BERT is bidirectional; expected "
        "\"bidirectional\", found \"unidirectional\"");
  CHECK_THAT(error_after(
                 [&](Json& d) {
                   bert(d);
                   d["pipeline"] = {{"stages", 2}};
                 },
                 2),
             Catch::Contains("the bert model trains data-parallel (with ZeRO)"));
  CHECK_THAT(error_after([&](Json& d) {
               bert(d);
               d["trainer"]["sample"] = {{"tokens", 10}};
             }),
             Catch::Contains("the bert model does not generate text; expected 0, found 10"));
  CHECK(error_after([](Json& d) { d["model"]["type"] = "bret"; }) ==
        "[config] $.model.type: expected one of \"gpt2\", \"bert\"; found \"bret\"");
}

}  // namespace
}  // namespace tessera::train
