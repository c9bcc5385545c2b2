#include "parallel/zero/zero_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "core/error.h"

namespace tessera::parallel {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// ZeRO-Offload's keys (deepspeed/runtime/zero/offload_config.py), which real configs often
// carry switched off: accepted, with their keys checked, when they keep everything on the
// device ("device": "none", the deprecated booleans false); an error otherwise.
void read_offload_switched_off(JsonObjectReader& s) {
  const char* why = "ZeRO-Offload is not implemented yet; expected \"device\": \"none\"";
  for (const char* key : {"offload_optimizer", "offload_param"}) {
    if (!s.has(key)) continue;
    JsonObjectReader o = s.object(key);
    const std::string device = o.get<std::string>("device", "none");
    TS_CHECK(device == "none", "[config] ", o.key_path("device"), ": ", why, ", found \"", device,
             "\"");
    o.get<std::string>("nvme_path", "");
    o.get_in_range<int64_t>("buffer_count", 5, 0, kMax);
    o.get<bool>("pin_memory", false);
    if (std::string(key) == "offload_optimizer") {
      o.get<bool>("pipeline_read", false);
      o.get<bool>("pipeline_write", false);
      o.get<bool>("fast_init", false);
      o.get_in_range<double>("ratio", 1.0, 0.0, 1.0);
    } else {
      o.get_in_range<double>("buffer_size", 1e8, 0, 9e18);
      o.get_in_range<double>("max_in_cpu", 1e9, 0, 9e18);
    }
  }
  for (const char* key : {"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory"}) {
    TS_CHECK(!s.get<bool>(key, false), "[config] ", s.key_path(key),
             ": ZeRO-Offload is not implemented yet; expected false");
  }
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

// An element count, written as an integer or in DeepSpeed's style as 5e8.
int64_t read_count(JsonObjectReader& s, const char* key, int64_t fallback, int64_t lo) {
  const double v =
      s.get_in_range<double>(key, static_cast<double>(fallback), static_cast<double>(lo), 9e18);
  TS_CHECK(v == std::floor(v), "[config] ", s.key_path(key),
           ": expected a whole number of elements, found ", v);
  return static_cast<int64_t>(v);
}

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
  s.get_in_range<double>("sub_group_size", 1e9, 1, 9e18);
  TS_CHECK(!s.get<bool>("legacy_stage1", false), "[config] ", s.key_path("legacy_stage1"),
           ": legacy_stage1 was removed from DeepSpeed; expected false");
  for (const auto& [key, why] : kUnsupported) s.unsupported(key, why);
  read_offload_switched_off(s);
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
