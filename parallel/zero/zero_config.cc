#include "parallel/zero/zero_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "core/error.h"

namespace tessera::parallel {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// An element count, written as an integer or in DeepSpeed's style as 5e8.
int64_t read_count(JsonObjectReader& s, const char* key, int64_t fallback, int64_t lo) {
  const double v =
      s.get_in_range<double>(key, static_cast<double>(fallback), static_cast<double>(lo), 9e18);
  TS_CHECK(v == std::floor(v), "[config] ", s.key_path(key),
           ": expected a whole number of elements, found ", v);
  return static_cast<int64_t>(v);
}

// offload_optimizer (deepspeed/runtime/zero/offload_config.py), and DeepSpeed's deprecated
// cpu_offload for its device "cpu".
OffloadOptimizerConfig read_offload_optimizer(JsonObjectReader& s, int stage) {
  OffloadOptimizerConfig c;
  const bool cpu_offload = s.get<bool>("cpu_offload", false);
  c.pin_memory = s.get<bool>("cpu_offload_use_pin_memory", false);  // deprecated spelling
  if (cpu_offload) c.device = OffloadOptimizerConfig::Device::cpu;
  if (s.has("offload_optimizer")) {
    JsonObjectReader o = s.object("offload_optimizer");
    const std::string device = o.get_one_of("device", "none", {"none", "cpu", "nvme"});
    TS_CHECK(!cpu_offload || device == "cpu", "[config] ", s.key_path("cpu_offload"),
             ": the deprecated spelling of offload_optimizer.device \"cpu\"; expected it to "
             "agree with offload_optimizer.device, found \"",
             device, "\"");
    if (device == "cpu") c.device = OffloadOptimizerConfig::Device::cpu;
    if (device == "nvme") c.device = OffloadOptimizerConfig::Device::nvme;
    c.nvme_path = o.get<std::string>("nvme_path", "");
    c.buffer_count = o.get_in_range<int64_t>("buffer_count", 4, 1, 1024);
    // Pinned host memory speeds transfers between a GPU and the host (Note [Offload on a
    // GPU]); the state of a run on the CPU is host memory already.
    c.pin_memory = o.get<bool>("pin_memory", false) || c.pin_memory;
    c.pipeline_read = o.get<bool>("pipeline_read", false);
    c.pipeline_write = o.get<bool>("pipeline_write", false);
    TS_CHECK(!o.get<bool>("fast_init", false), "[config] ", o.key_path("fast_init"),
             ": the optimizer's state is created at the first step and swapped out after it; "
             "expected false");
    const double ratio = o.get_in_range<double>("ratio", 1.0, 0.0, 1.0);
    TS_CHECK(ratio == 1.0, "[config] ", o.key_path("ratio"),
             ": partial offload is not implemented; expected 1.0, found ", ratio);
    TS_CHECK(c.device != OffloadOptimizerConfig::Device::nvme || !c.nvme_path.empty(), "[config] ",
             o.key_path("nvme_path"),
             ": expected the directory of the swap files with device "
             "\"nvme\", found none");
  }
  TS_CHECK(c.device == OffloadOptimizerConfig::Device::none || stage >= 1, "[config] ",
           s.key_path(s.has("offload_optimizer") ? "offload_optimizer" : "cpu_offload"),
           ": offloading the optimizer's state needs it partitioned; expected ZeRO stage 1-3, "
           "found stage ",
           stage);
  return c;
}

// offload_param (deepspeed/runtime/zero/offload_config.py), and DeepSpeed's deprecated
// cpu_offload_param for its device "cpu".
OffloadParamConfig read_offload_param(JsonObjectReader& s, int stage) {
  OffloadParamConfig c;
  const bool cpu_offload_param = s.get<bool>("cpu_offload_param", false);
  if (cpu_offload_param) c.device = OffloadParamConfig::Device::cpu;
  if (s.has("offload_param")) {
    JsonObjectReader o = s.object("offload_param");
    const std::string device = o.get_one_of("device", "none", {"none", "cpu", "nvme"});
    TS_CHECK(!cpu_offload_param || device == "cpu", "[config] ", s.key_path("cpu_offload_param"),
             ": the deprecated spelling of offload_param.device \"cpu\"; expected it to agree "
             "with offload_param.device, found \"",
             device, "\"");
    if (device == "cpu") c.device = OffloadParamConfig::Device::cpu;
    if (device == "nvme") c.device = OffloadParamConfig::Device::nvme;
    c.nvme_path = o.get<std::string>("nvme_path", "");
    c.buffer_count = o.get_in_range<int64_t>("buffer_count", 5, 1, 1024);
    c.buffer_size = read_count(o, "buffer_size", c.buffer_size, 1);
    TS_CHECK(c.buffer_size <= (int64_t{1} << 40), "[config] ", o.key_path("buffer_size"),
             ": expected at most 2^40 elements, found ", c.buffer_size);
    // Pinned host memory speeds a GPU run's copies; a CPU run's parameters are host memory.
    c.pin_memory = o.get<bool>("pin_memory", false);
    // DeepSpeed's cap on the parameter elements kept in host memory with device "nvme"
    // (deepspeed/runtime/zero/offload_config.py): an upper bound, which Tessera meets by keeping
    // none there beyond the chunk being read or written (Note [Offloaded parameters] in
    // partitioned_params.h).
    o.get_in_range<double>("max_in_cpu", 1e9, 0, 9e18);
    TS_CHECK(c.device != OffloadParamConfig::Device::nvme || !c.nvme_path.empty(), "[config] ",
             o.key_path("nvme_path"),
             ": expected the directory of the swap files with device \"nvme\", found none");
  }
  TS_CHECK(c.device == OffloadParamConfig::Device::none || stage == 3, "[config] ",
           s.key_path(s.has("offload_param") ? "offload_param" : "cpu_offload_param"),
           ": offloading parameters needs them partitioned; expected ZeRO stage 3, found stage ",
           stage);
  return c;
}

// DeepSpeed keys of features Tessera does not have: present, they are errors.
const std::pair<const char*, const char*> kUnsupported[] = {
    {"elastic_checkpoint", "DeepSpeed no longer supports it either"},
    {"zero_hpz_partition_size", "ZeRO++ is not implemented"},
    {"zero_quantized_weights", "ZeRO++ is not implemented"},
    {"zero_quantized_nontrainable_weights", "ZeRO++ is not implemented"},
    {"zero_quantized_gradients", "ZeRO++ is not implemented"},
    {"zeropp_loco_param", "ZeRO++ is not implemented"},
    {"mics_shard_size", "MiCS is not implemented"},
    {"mics_hierarchical_params_gather", "MiCS is not implemented"},
};

}  // namespace

int64_t ZeroConfig::block_numel() const {
  return std::min(reduce_bucket_size, allgather_bucket_size);
}

ZeroConfig parse_zero_config(JsonObjectReader s) {
  ZeroConfig c;
  c.stage = s.get_in_range<int>("stage", 0, 0, 3);
  c.contiguous_gradients = s.get<bool>("contiguous_gradients", true);
  c.reduce_scatter = s.get<bool>("reduce_scatter", true);
  c.reduce_bucket_size = read_count(s, "reduce_bucket_size", c.reduce_bucket_size, 1);
  c.allgather_bucket_size = read_count(s, "allgather_bucket_size", c.allgather_bucket_size, 2);
  TS_CHECK(c.allgather_bucket_size % 2 == 0, "[config] ", s.key_path("allgather_bucket_size"),
           ": expected a multiple of 2 (DeepSpeed's rule), found ", c.allgather_bucket_size);
  c.overlap_comm = s.get<bool>("overlap_comm", c.stage == 3);
  // Stage 3 sizes, each with the spelling DeepSpeed still accepts without the prefix.
  const std::tuple<const char*, const char*, int64_t ZeroConfig::*> stage3[] = {
      {"prefetch_bucket_size", "stage3_prefetch_bucket_size",
       &ZeroConfig::stage3_prefetch_bucket_size},
      {"param_persistence_threshold", "stage3_param_persistence_threshold",
       &ZeroConfig::stage3_param_persistence_threshold},
      {"max_live_parameters", "stage3_max_live_parameters",
       &ZeroConfig::stage3_max_live_parameters},
      {"max_reuse_distance", "stage3_max_reuse_distance", &ZeroConfig::stage3_max_reuse_distance},
  };
  for (const auto& [alias, key, field] : stage3) {
    s.deprecated_alias(alias, key);
    c.*field = read_count(s, key, c.*field, 0);
  }
  // Accepted with their defaults; they describe how DeepSpeed's own buffers work.
  s.get<bool>("use_multi_rank_bucket_allreduce", true);
  s.get<bool>("allgather_partitions", true);
  s.get<bool>("load_from_fp32_weights", true);  // the weights are fp32 already
  s.get<bool>("ignore_unused_parameters", true);
  s.get<bool>("round_robin_gradients", false);
  c.sub_group_size = read_count(s, "sub_group_size", c.sub_group_size, 1);
  TS_CHECK(!s.get<bool>("legacy_stage1", false), "[config] ", s.key_path("legacy_stage1"),
           ": legacy_stage1 was removed from DeepSpeed; expected false");
  for (const auto& [key, why] : kUnsupported) s.unsupported(key, why);
  c.offload_optimizer = read_offload_optimizer(s, c.stage);
  c.offload_param = read_offload_param(s, c.stage);
  s.get_in_range<double>("stage3_model_persistence_threshold", 9e18, 0, 9e18);
  s.deprecated_alias("stage3_gather_fp16_weights_on_model_save",
                     "stage3_gather_16bit_weights_on_model_save");
  TS_CHECK(!s.get<bool>("stage3_gather_16bit_weights_on_model_save", false), "[config] ",
           s.key_path("stage3_gather_16bit_weights_on_model_save"),
           ": stage 3 checkpoints keep the weights in the ranks' shards (tools/zero_to_fp32 "
           "writes them whole); expected false");
  s.get_in_range<int64_t>("stage3_module_granularity_threshold", 0, 0, kMax);
  s.get<bool>("stage3_use_all_reduce_for_fetch_params", false);
  return c;
}

}  // namespace tessera::parallel
