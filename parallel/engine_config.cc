#include "parallel/engine_config.h"

#include <iterator>
#include <limits>

#include "core/error.h"
#include "parallel/compression/onebit_config.h"
#include "parallel/pipeline/partition.h"
#include "parallel/topology.h"

namespace tessera::parallel {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// NVMe offload's I/O settings (deepspeed/runtime/swap_tensor/aio_config.py; core/direct_file.h).
AioConfig read_aio(JsonObjectReader& root) {
  JsonObjectReader s = root.object("aio");
  AioConfig c;
  c.block_size = s.get_in_range<int64_t>("block_size", c.block_size, 1, kMaxBlockSize);
  c.queue_depth = s.get_in_range<int>("queue_depth", c.queue_depth, 1, 1024);
  // DeepSpeed's documentation calls it thread_count and its code reads
  // intra_op_parallelism: either spelling, and both must agree.
  c.intra_op_parallelism = s.get_in_range<int>("intra_op_parallelism", 1, 1, 64);
  if (s.has("thread_count")) {
    const int threads = s.get_in_range<int>("thread_count", 1, 1, 64);
    TS_CHECK(!s.has("intra_op_parallelism") || threads == c.intra_op_parallelism, "[config] ",
             s.key_path("thread_count"),
             ": the documented name of intra_op_parallelism; "
             "expected the same value, found ",
             threads, " and ", c.intra_op_parallelism);
    c.intra_op_parallelism = threads;
  }
  c.single_submit = s.get<bool>("single_submit", c.single_submit);
  c.overlap_events = s.get<bool>("overlap_events", c.overlap_events);
  TS_CHECK(!s.get<bool>("use_gds", false), "[config] ", s.key_path("use_gds"),
           ": GPUDirect Storage is not implemented; expected false");
  TS_CHECK(c.block_size % kDirectIoAlignment == 0, "[config] ", s.key_path("block_size"),
           ": direct I/O moves whole blocks of ", kDirectIoAlignment,
           " bytes; expected a multiple of it, found ", c.block_size);
  return c;
}

// DeepSpeed sections of features Tessera does not have (configs/README.md lists them):
// accepted when they say "enabled": false, as real configs often carry them; otherwise
// errors that say why, never "unknown key" and never silently ignored.
const std::pair<const char*, const char*> kNotSupported[] = {
    {"amp", "Apex AMP is PyTorch-only; use fp16 or bf16"},
    {"data_efficiency", "data efficiency (curriculum, random-LTD) is not implemented"},
    {"comms_logger", "communication logging is not implemented"},
    {"compression_training", "compression training is outside Tessera's scope"},
    {"eigenvalue", "eigenvalue-based quantization schedules are outside Tessera's scope"},
    {"quantize_training", "quantized training is outside Tessera's scope"},
    {"weight_quantization", "weight quantization is outside Tessera's scope"},
    {"hybrid_engine", "DeepSpeed-Chat's hybrid engine is outside Tessera's scope"},
    {"autotuning", "DeepSpeed's autotuner is outside Tessera's scope"},
    {"nebula", "Nebula checkpointing is Azure-only"},
};

// Fails for section `key` of kNotSupported unless it is absent or says "enabled": false.
void refuse_unless_disabled(JsonObjectReader& root, const char* key, const char* why) {
  const nlohmann::json* v = root.raw(key);
  if (v == nullptr) return;
  const bool disabled = v->is_object() && v->contains("enabled") && v->at("enabled").is_boolean() &&
                        !v->at("enabled").get<bool>();
  TS_CHECK(disabled, "[config] ", root.key_path(key), " is not supported by Tessera: ", why,
           "; expected it absent or with \"enabled\": false");
}

// DeepSpeed's name of a dtype: "fp32", "fp16", "bf16".
// DeepSpeed's dtype names: its config names first, then the other names of its DtypeEnum
// (deepspeed/runtime/config_utils.py), which data_types takes.
constexpr std::pair<const char*, DType> kDtypeNames[] = {
    {"fp32", DType::f32},      {"fp16", DType::f16},    {"bf16", DType::bf16},
    {"float32", DType::f32},   {"float", DType::f32},   {"torch.float32", DType::f32},
    {"float16", DType::f16},   {"half", DType::f16},    {"torch.float16", DType::f16},
    {"bfloat16", DType::bf16}, {"bfloat", DType::bf16}, {"torch.bfloat16", DType::bf16}};
constexpr size_t kConfigDtypeNames = 3;  // "fp32", "fp16", "bf16"

std::string deepspeed_dtype_name(DType dtype) {
  for (size_t i = 0; i < kConfigDtypeNames; ++i) {
    if (kDtypeNames[i].second == dtype) return kDtypeNames[i].first;
  }
  return std::string(dtype_name(dtype));
}

// A DeepSpeed dtype name at `key`, or nothing: "fp32", "fp16" or "bf16"; with `aliases`
// also the DtypeEnum names.
std::optional<DType> read_dtype(JsonObjectReader& section, const char* key, bool aliases) {
  const std::optional<std::string> name = section.optional<std::string>(key);
  if (!name) return std::nullopt;
  const size_t count = aliases ? std::size(kDtypeNames) : kConfigDtypeNames;
  for (size_t i = 0; i < count; ++i) {
    if (*name == kDtypeNames[i].first) return kDtypeNames[i].second;
  }
  TS_FAIL("[config] ", section.key_path(key), ": expected \"fp32\", \"fp16\" or \"bf16\"",
          aliases ? " (or another name of DeepSpeed's DtypeEnum)" : "", ", found \"", *name, "\"");
}

// fp16's loss-scaling keys of `s`, checked, into `scaler`.
void read_loss_scaler(JsonObjectReader& s, optim::LossScalerConfig& scaler) {
  scaler.static_scale = s.get_in_range<double>("loss_scale", 0.0, 0.0, 1e30);
  scaler.initial_scale_power = s.get_in_range<int64_t>("initial_scale_power", 16, 0, 64);
  scaler.window = s.get_in_range<int64_t>("loss_scale_window", 1000, 1, kMax);
  scaler.hysteresis = s.get_in_range<int64_t>("hysteresis", 2, 1, kMax);
  scaler.consecutive_hysteresis = s.get<bool>("consecutive_hysteresis", false);
  scaler.min_scale = s.get_in_range<double>("min_loss_scale", 1.0, 1e-30, 1e30);
}

// `section` {enabled, ...}: whether it is enabled. The other keys are validated by name and
// type so that a typo is still caught when the section is off; fp16's scaler keys go to
// `scaler`.
bool read_precision(JsonObjectReader& root, const char* key, optim::LossScalerConfig& scaler) {
  JsonObjectReader s = root.object(key);
  const bool enabled = s.get<bool>("enabled", false);
  if (std::string(key) == "fp16") {
    TS_CHECK(!s.get<bool>("auto_cast", false), "[config] ", s.key_path("auto_cast"),
             ": fp16 here is DeepSpeed's half-precision model with fp32 master weights; autocast "
             "of fp32 parameters is not implemented; expected false");
    read_loss_scaler(s, scaler);
    TS_CHECK(!s.get<bool>("fp16_master_weights_and_grads", false), "[config] ",
             s.key_path("fp16_master_weights_and_grads"),
             ": master weights and gradients are fp32 (the optimizer-offload variant that keeps "
             "them in fp16 is not implemented); expected false");
    return enabled;
  }
  TS_CHECK(!s.get<bool>("immediate_grad_update", false), "[config] ",
           s.key_path("immediate_grad_update"),
           ": each micro-batch's bf16 gradients are added into their f32 sum after its "
           "backward, not from backward's hooks; expected false");
  // fp16's scaler keys copied under bf16 (DeepSpeed's older releases ignore them, newer
  // ones refuse them): checked, and one warning that they do nothing.
  std::string copied;
  for (const char* k : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                        "consecutive_hysteresis", "min_loss_scale"}) {
    if (s.has(k)) copied += (copied.empty() ? "" : ", ") + std::string(k);
  }
  if (!copied.empty()) {
    optim::LossScalerConfig unused;
    read_loss_scaler(s, unused);
    root.warn(str_cat("[config] ", s.path(), ": ", copied,
                      " are fp16's loss-scaling keys; bf16 needs no loss scale, so they do "
                      "nothing here"));
  }
  return enabled;
}

// $.simulated_network {bandwidth_gbps, latency_us}: a Tessera extension. Absent, no link is
// modeled; present, it needs a positive bandwidth.
SimulatedLink read_simulated_network(JsonObjectReader& root) {
  SimulatedLink link;
  if (!root.has("simulated_network")) return link;
  JsonObjectReader s = root.required_object("simulated_network");
  link.gbit_per_s = s.required<double>("bandwidth_gbps");
  TS_CHECK(link.gbit_per_s > 0 && link.gbit_per_s <= 1e6, "[config] ", s.key_path("bandwidth_gbps"),
           ": expected the simulated link's bandwidth in Gbit/s, > 0 and <= 1e6, found ",
           link.gbit_per_s, " (leave the section out to simulate no network)");
  link.latency_us = s.get_in_range<double>("latency_us", 0.0, 0.0, 1e9);
  return link;
}

// DeepSpeed's section `key` of the root, or else the client's stand-in for it (at most one
// of them); `key` "optimizer" must be in one of the two places.
JsonObjectReader client_section(JsonObjectReader& root, const char* key,
                                const std::optional<JsonObjectReader>& from_client) {
  const bool in_root = root.has(key);
  if (from_client) {
    TS_CHECK(!in_root, "[config] ", root.key_path(key), " and ", from_client->path(),
             " are both given: DeepSpeed's section is for a run without a client ", key, ", and ",
             from_client->path(), " is Tessera's client ", key, "; expected one of them");
    return *from_client;
  }
  TS_CHECK(in_root || std::string(key) != "optimizer", "[config] ", root.key_path(key),
           ": required section missing; expected {\"type\": \"AdamW\", \"params\": {...}} "
           "there or, as a Megatron-LM or Hugging Face config leaves it to its framework, in "
           "$.trainer.optimizer");
  return root.object(key);
}

}  // namespace

BatchConfig resolve_batch(std::optional<int64_t> tbs, std::optional<int64_t> mbs,
                          std::optional<int64_t> gas, int64_t w) {
  TS_CHECK(w >= 1, "[config] data-parallel world size must be >= 1, found ", w);
  // DeepSpeed's messages, checked on the given keys before any is divided by another.
  TS_CHECK(!tbs || *tbs > 0, "[config] Train batch size: ", *tbs, " has to be greater than 0");
  TS_CHECK(!mbs || *mbs > 0, "[config] Micro batch size per gpu: ", *mbs,
           " has to be greater than 0");
  TS_CHECK(!gas || *gas > 0, "[config] Gradient accumulation steps: ", *gas,
           " has to be greater than 0");
  // micro x accumulation x world, or an error when it overflows.
  const auto global = [w](int64_t micro, int64_t accumulation) {
    int64_t product = 0;
    TS_CHECK(!__builtin_mul_overflow(micro, accumulation, &product) &&
                 !__builtin_mul_overflow(product, w, &product),
             "[config] micro_batch_per_gpu * gradient_acc_step * world_size overflows: ", micro,
             " * ", accumulation, " * ", w);
    return product;
  };
  BatchConfig b;
  if (tbs && mbs && gas) {
    b = {*tbs, *mbs, *gas};
  } else if (tbs && mbs) {
    b = {*tbs, *mbs, *tbs / *mbs / w};
  } else if (tbs && gas) {
    b = {*tbs, *tbs / w / *gas, *gas};
  } else if (mbs && gas) {
    b = {global(*mbs, *gas), *mbs, *gas};
  } else if (tbs) {
    b = {*tbs, *tbs / w, 1};
  } else if (mbs) {
    b = {global(*mbs, 1), *mbs, 1};
  } else {
    TS_FAIL(
        "[config] Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
        "provided");
  }
  TS_CHECK(b.train_batch_size > 0, "[config] Train batch size: ", b.train_batch_size,
           " has to be greater than 0");
  TS_CHECK(b.train_micro_batch_size_per_gpu > 0,
           "[config] Micro batch size per gpu: ", b.train_micro_batch_size_per_gpu,
           " has to be greater than 0");
  TS_CHECK(b.gradient_accumulation_steps > 0,
           "[config] Gradient accumulation steps: ", b.gradient_accumulation_steps,
           " has to be greater than 0");
  TS_CHECK(
      b.train_batch_size == global(b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps),
      "[config] Check batch related parameters. train_batch_size is not equal to "
      "micro_batch_per_gpu * gradient_acc_step * world_size ",
      b.train_batch_size, " != ", b.train_micro_batch_size_per_gpu, " * ",
      b.gradient_accumulation_steps, " * ", w);
  return b;
}

EngineConfig parse_engine_config(JsonObjectReader& root, const ClientSections& client) {
  EngineConfig c;
  c.train_batch_size = root.optional<int64_t>("train_batch_size");
  c.train_micro_batch_size_per_gpu = root.optional<int64_t>("train_micro_batch_size_per_gpu");
  c.gradient_accumulation_steps = root.optional<int64_t>("gradient_accumulation_steps");
  for (const auto& [key, why] : kNotSupported) refuse_unless_disabled(root, key, why);
  if (ElasticityConfig e = ElasticityConfig::from_json(root.object("elasticity")); e.enabled) {
    // DeepSpeed's error (deepspeed/runtime/config.py), unless told to override the keys.
    TS_CHECK(e.ignore_non_elastic_batch_info ||
                 !(c.train_batch_size || c.train_micro_batch_size_per_gpu ||
                   c.gradient_accumulation_steps),
             "[config] $.elasticity: One or more batch related parameters were found in your "
             "config (train_batch_size, train_micro_batch_size_per_gpu, and/or "
             "gradient_accumulation_steps). These parameters *will not be used* since elastic "
             "training is enabled, which takes control of these parameters. If you want to "
             "suppress this error (the parameters will be silently ignored) please set "
             "'ignore_non_elastic_batch_info': true in your config.");
    c.elasticity = e;
  }
  c.curriculum = CurriculumConfig::from_json(root.object("curriculum_learning"));
  c.layer_drop = LayerDropConfig::from_json(root.object("progressive_layer_drop"));
  // Without effect (configs/README.md, "Accepted but without effect").
  root.get<bool>("zero_allow_untested_optimizer", false);
  // DeepSpeed's MoE group layout: E+D (false, its default) is the one Tessera builds (Note
  // [Expert groups] in parallel/expert/expert_groups.h).
  TS_CHECK(!root.get<bool>("use_data_before_expert_parallelism", false), "[config] ",
           root.key_path("use_data_before_expert_parallelism"),
           ": DeepSpeed's D+E layout of the expert groups is not built by Tessera, which builds "
           "E+D (expert groups of consecutive data ranks); expected false or absent");
  // Where the average divides (Note [Gradient averaging] in parallel/zero/gradient_reducer.h).
  const bool prescale = root.get<bool>("prescale_gradients", false);
  const double predivide = root.get_in_range<double>("gradient_predivide_factor", 1.0, 1e-30, 1e30);
  c.mixed_precision.communication = read_dtype(root, "communication_data_type", false);
  JsonObjectReader data_types = root.object("data_types");
  c.mixed_precision.accumulation = read_dtype(data_types, "grad_accum_dtype", true);
  const JsonObjectReader optimizer = client_section(root, "optimizer", client.optimizer);
  c.optimizer = optim::parse_optimizer(optimizer, onebit_optimizer_types());
  if (root.has("scheduler") || client.scheduler) {
    c.scheduler =
        optim::parse_scheduler(client_section(root, "scheduler", client.scheduler), c.optimizer.lr);
  }
  c.gradient_clipping = root.get_in_range<double>("gradient_clipping", 0.0, 0.0, 1e30);
  c.steps_per_print = root.get_in_range<int64_t>("steps_per_print", c.steps_per_print, 1, kMax);
  c.wall_clock_breakdown = root.get<bool>("wall_clock_breakdown", false);
  const bool fp16 = read_precision(root, "fp16", c.mixed_precision.scaler);
  root.deprecated_alias("bfloat16", "bf16");
  optim::LossScalerConfig unused;
  const bool bf16 = read_precision(root, "bf16", unused);
  TS_CHECK(!(fp16 && bf16), "[config] ", root.key_path("bf16"),
           ".enabled: fp16 and bf16 are both enabled; expected at most one");
  c.mixed_precision.dtype = fp16 ? DType::f16 : bf16 ? DType::bf16 : DType::f32;

  c.zero = parse_zero_config(root.object("zero_optimization"));
  c.zero.aio = read_aio(root);
  c.zero.prescale_gradients = prescale;
  c.zero.gradient_predivide_factor = predivide;
  const DType dtype = c.mixed_precision.dtype;
  // fp16 has 5 exponent bits: unscaled gradients underflow in it and large ones overflow,
  // and only fp16 training has the loss scale and the overflow check that make it safe.
  TS_CHECK(c.mixed_precision.communication != DType::f16 || dtype == DType::f16, "[config] ",
           root.key_path("communication_data_type"),
           ": fp16 reductions need fp16 training's loss scaling and overflow check; expected "
           "\"fp32\" or \"bf16\" with ",
           deepspeed_dtype_name(dtype), " training, found \"fp16\"");
  if (const std::optional<DType> accumulation = c.mixed_precision.accumulation) {
    const std::string key = data_types.key_path("grad_accum_dtype");
    TS_CHECK(*accumulation == DType::f32 || *accumulation == dtype, "[config] ", key,
             ": gradients accumulate in fp32 or in the model's ", deepspeed_dtype_name(dtype),
             "; expected one of them, found ", deepspeed_dtype_name(*accumulation));
    TS_CHECK(c.zero.stage < 2 || *accumulation == DType::f32, "[config] ", key, ": ZeRO stage ",
             c.zero.stage,
             " adds each micro-batch's reduced gradient into an fp32 shard; expected fp32, found ",
             deepspeed_dtype_name(*accumulation));
  }
  TS_CHECK(c.zero.stage == 0 || c.optimizer.type != optim::OptimizerType::lamb, "[config] ",
           "$.zero_optimization.stage: LAMB's trust ratio needs each parameter whole, and ZeRO "
           "stage ",
           c.zero.stage, " shards them; expected stage 0 with LAMB");
  // DeepSpeed's assertions, with its words: the 1-bit optimizers compress whole replicas'
  // momenta and hold per-rank error buffers over every parameter.
  const OneBitConfig* onebit = onebit_config(c.optimizer);
  TS_CHECK(c.zero.stage == 0 || onebit == nullptr, "[config] ",
           "$.zero_optimization.stage: ", onebit ? onebit->display_name() : "",
           " is not compatible with ZeRO; expected stage 0, found stage ", c.zero.stage);

  JsonObjectReader ac = root.object("activation_checkpointing");
  c.activation_checkpointing.partition_activations = ac.get<bool>("partition_activations", false);
  c.activation_checkpointing.cpu_checkpointing = ac.get<bool>("cpu_checkpointing", false);
  c.activation_checkpointing.synchronize_checkpoint_boundary =
      ac.get<bool>("synchronize_checkpoint_boundary", false);
  c.activation_checkpointing.profile = ac.get<bool>("profile", false);
  if (ac.get<bool>("contiguous_memory_optimization", false)) {
    ac.unsupported("contiguous_memory_optimization",
                   "DeepSpeed copies checkpointed activations into one preallocated buffer "
                   "against fragmentation; Tessera's caching allocator reuses the equal-sized "
                   "blocks of each step's checkpoints already, so the copy would only cost "
                   "time; expected false or absent");
  }
  // Sizes DeepSpeed's contiguous buffer only (null, its default, or a count): without
  // effect here (configs/README.md, "Accepted but without effect").
  if (const nlohmann::json* n = ac.raw("number_checkpoints"); n != nullptr && !n->is_null()) {
    ac.get_in_range<int64_t>("number_checkpoints", 0, 1, kMax);
  }

  JsonObjectReader pipe = root.object("pipeline");
  c.pipeline.stages = pipe.get_in_range<int64_t>("stages", 1, 1, 1 << 16);
  // DeepSpeed's JSON names the method `partition` (its PipelineModule argument is
  // partition_method); its default there, "best", is read by nothing in DeepSpeed and means
  // the default here.
  const char* method_key = pipe.has("partition") ? "partition" : "partition_method";
  TS_CHECK(!(pipe.has("partition") && pipe.has("partition_method")), "[config] ",
           pipe.key_path("partition"), " and ", pipe.key_path("partition_method"),
           " name the same choice; expected one of them");
  c.pipeline.partition_method = pipe.get<std::string>(method_key, "parameters");
  if (c.pipeline.partition_method == "best") c.pipeline.partition_method = "parameters";
  pipeline::check_partition_method(c.pipeline.partition_method, pipe.key_path(method_key));
  c.pipeline.pipe_partitioned = pipe.get<bool>("pipe_partitioned", true);
  c.pipeline.grad_partitioned = pipe.get<bool>("grad_partitioned", true);
  c.pipeline.overlap_transfers = pipe.get<bool>("overlap_transfers", true);
  // Without effect (configs/README.md, "Accepted but without effect"): every parameter is
  // initialized from a stream keyed by its name, so each layer's values never depend on
  // the others or on the stage layout, whatever this says.
  pipe.get<bool>("seed_layers", false);
  c.pipeline.activation_checkpoint_interval =
      pipe.get_in_range<int64_t>("activation_checkpoint_interval", 0, 0, kMax);
  JsonObjectReader tp = root.object("tensor_parallel");
  c.tensor_parallel.tp_size = tp.get_in_range<int64_t>("tp_size", 1, 1, 1 << 16);
  c.tensor_parallel.overlap_comm = tp.get<bool>("overlap_comm", true);
  c.tensor_parallel.batch_split = tp.get_in_range<int64_t>("batch_split", 1, 1, 1 << 16);
  TS_CHECK(c.tensor_parallel.batch_split == 1 ||
               (c.tensor_parallel.tp_size > 1 && c.tensor_parallel.overlap_comm),
           "[config] ", tp.key_path("batch_split"), ": ", c.tensor_parallel.batch_split,
           " pieces overlap the tensor-parallel sums of one with another's computation; "
           "expected tp_size > 1 and overlap_comm true, found tp_size ",
           c.tensor_parallel.tp_size, " and overlap_comm ",
           c.tensor_parallel.overlap_comm ? "true" : "false");
  c.simulated_link = read_simulated_network(root);
  TS_CHECK(c.pipeline.stages == 1 || c.zero.stage <= 1, "[config] ",
           "$.zero_optimization.stage: stage ", c.zero.stage,
           " reduces gradients during backward, before a pipeline sums its tied embedding's "
           "gradients; expected stage 0 or 1 with pipeline.stages ",
           c.pipeline.stages, " (as DeepSpeed's PipelineEngine)");
  TS_CHECK(c.pipeline.stages == 1 || !is_half(c.mixed_precision.dtype) ||
               c.mixed_precision.accumulation != DType::f32,
           "[config] $.data_types.grad_accum_dtype: pipeline stages sum their micro-batches' "
           "gradients in the model's ",
           deepspeed_dtype_name(c.mixed_precision.dtype),
           " (the tied embedding's copies are summed in them before the reduction); expected ",
           deepspeed_dtype_name(c.mixed_precision.dtype), " or no grad_accum_dtype, found fp32");
  TS_CHECK(c.tensor_parallel.tp_size == 1 || c.zero.stage <= 2, "[config] ",
           "$.zero_optimization.stage: stage 3 with tensor_parallel.tp_size ",
           c.tensor_parallel.tp_size, " is not supported; expected stage 0, 1 or 2");
  TS_CHECK(c.tensor_parallel.tp_size == 1 || (c.optimizer.type != optim::OptimizerType::lamb &&
                                              !(onebit && onebit->kind == OneBitKind::lamb)),
           "[config] $.optimizer.type: LAMB's trust ratio needs each parameter whole, and "
           "tensor_parallel.tp_size ",
           c.tensor_parallel.tp_size, " slices them; expected tp_size 1 with LAMB");
  return c;
}

void finish_engine_config(EngineConfig& config, int64_t world_size) {
  const ProcessGrid grid =
      ProcessGrid::for_world(static_cast<int>(world_size), static_cast<int>(config.pipeline.stages),
                             static_cast<int>(config.tensor_parallel.tp_size));
  config.data_parallel_size = grid.data_size();
  if (const std::optional<ElasticityConfig>& e = config.elasticity) {
    // Note [Elastic batch] in parallel/elasticity.h: the batch keys are the elastic ones.
    const int64_t model = config.pipeline.stages * config.tensor_parallel.tp_size;
    TS_CHECK(e->model_parallel_size == model,
             "[config] $.elasticity.model_parallel_size: expected pipeline.stages x "
             "tensor_parallel.tp_size (",
             model, "), found ", e->model_parallel_size);
    const int64_t world = grid.data_size();
    const ElasticBatch b = elastic_batch(*e, world);
    const int64_t micro = elastic_micro_batch(*e, b, world);
    config.batch = resolve_batch(b.train_batch_size, micro, std::nullopt, world);
    return;
  }
  config.batch = resolve_batch(config.train_batch_size, config.train_micro_batch_size_per_gpu,
                               config.gradient_accumulation_steps, grid.data_size());
}

}  // namespace tessera::parallel
