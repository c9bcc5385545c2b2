#include "tools/trainer/config_summary.h"

#include <fmt/core.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/zero/memory_estimate.h"
#include "tools/data/loader.h"

namespace tessera::train {
namespace {

// The optimizer as DeepSpeed names its type.
std::string optimizer_name(const optim::OptimizerConfig& o) {
  switch (o.type) {
    case optim::OptimizerType::adam:
      return o.adam.adam_w_mode ? "AdamW" : "Adam";
    case optim::OptimizerType::sgd:
      return "SGD";
    case optim::OptimizerType::lamb:
      return "Lamb";
    case optim::OptimizerType::external:
      return o.external->name();
  }
  TS_INTERNAL_ASSERT(false, "unhandled optimizer type");
  return "";
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

}  // namespace

std::vector<std::string> describe_run_config(const RunConfig& c, int64_t world_size) {
  const parallel::EngineConfig& e = c.engine;
  const int64_t stages = e.pipeline.stages, tp = e.tensor_parallel.tp_size;
  const DType dtype = e.mixed_precision.dtype;
  std::vector<std::string> lines;
  lines.push_back(str_cat("ranks: ", world_size, " = ", stages, " pipeline stage(s) x ",
                          e.data_parallel_size, " data-parallel x ", tp, " tensor-parallel"));
  lines.push_back(str_cat("batch: train_batch_size ", e.batch.train_batch_size, " = micro-batch ",
                          e.batch.train_micro_batch_size_per_gpu, " x accumulation ",
                          e.batch.gradient_accumulation_steps, " x ", e.data_parallel_size,
                          " data-parallel rank(s); ", c.data.seq_len, " tokens per sequence"));
  const parallel::MixedPrecision& mp = e.mixed_precision;
  const int stage = static_cast<int>(e.zero.stage);
  std::string precision = str_cat("precision: ", dtype_name(dtype));
  if (is_half(dtype)) {
    precision += str_cat(" with f32 master weights; gradients reduced in ",
                         dtype_name(mp.communication_dtype()), ", accumulated in ",
                         dtype_name(mp.accumulation_dtype(stage)));
  }
  lines.push_back(precision + str_cat("; ZeRO stage ", e.zero.stage));
  lines.push_back(str_cat(
      "optimizer: ", optimizer_name(e.optimizer), ", lr ", e.optimizer.lr, ", weight decay ",
      e.optimizer.weight_decay, "; schedule: ", e.scheduler ? e.scheduler->name() : "constant",
      "; gradient clipping: ", e.gradient_clipping > 0 ? str_cat(e.gradient_clipping) : "off"));
  lines.push_back("model: " + c.model->describe());
  // Each rank of a pipeline stage and tensor slice holds about 1 / (stages x tp) of them; under
  // expert parallelism (no stages or slices) a rank holds 1 / ep_size of the experts, sharded
  // over the ep_size-th part of the data group that holds the same ones.
  const int64_t ep = c.model->expert_parallel_size();
  const int64_t experts = ep > 1 ? c.model->expert_parameters() : 0;
  const int64_t part = (c.model->num_parameters() - experts + stages * tp - 1) / (stages * tp);
  const int dp_size = static_cast<int>(e.data_parallel_size);
  const bool f32_accumulation = is_half(dtype) && mp.accumulation_dtype(stage) == DType::f32 &&
                                e.batch.gradient_accumulation_steps > 1;
  // As the trainer's make_expert_groups says it at start-up.
  TS_CHECK(dp_size % ep == 0, "[expert parallel] ep_size ", ep,
           ": expected a divisor of the data-parallel group's ", dp_size, " ranks");
  const int64_t state = parallel::expert_split_model_state_bytes(
      [&](int64_t params, int ranks) {
        return is_half(dtype)
                   ? parallel::mixed_model_state_bytes(stage, params, ranks, f32_accumulation)
                   : parallel::fp32_model_state_bytes(stage, params, ranks);
      },
      part + experts, experts, dp_size, experts > 0 ? static_cast<int>(ep) : 1);
  std::string where;
  const bool optimizer_nvme =
      e.zero.offload_optimizer.device == parallel::OffloadOptimizerConfig::Device::nvme;
  const bool params_nvme =
      e.zero.offload_param.device == parallel::OffloadParamConfig::Device::nvme;
  const bool optimizer_off =
      e.zero.offload_optimizer.device != parallel::OffloadOptimizerConfig::Device::none;
  const bool params_off = e.zero.offload_param.device != parallel::OffloadParamConfig::Device::none;
  if (c.trainer.device.is_cuda() && (optimizer_off || params_off)) {
    // Note [Offload on a GPU]: what leaves the device, the gradients excepted.
    const int64_t off = parallel::nvme_model_state_bytes(stage, part, dp_size, is_half(dtype),
                                                         optimizer_off, params_off, false);
    where = str_cat(": ", mib(state - off), " on the GPU, ", mib(off),
                    optimizer_nvme || params_nvme ? " in host memory and the NVMe swap file"
                                                  : " in host memory");
  } else if (optimizer_nvme || params_nvme) {
    const int64_t nvme = parallel::nvme_model_state_bytes(stage, part, dp_size, is_half(dtype),
                                                          optimizer_nvme, params_nvme);
    where = str_cat(": ", mib(state - nvme), " in memory, ", mib(nvme), " in the NVMe swap file");
  }
  const std::string held = experts > 0
                               ? str_cat(part, " parameters besides the experts and ", experts / ep,
                                         " of the experts' (1 / ep_size) per rank")
                               : str_cat(part, " parameters per stage and slice");
  lines.push_back(str_cat("model states per rank: ", mib(state), where, " (", held,
                          "; activations and buckets come on top)"));
  lines.push_back(str_cat("training: ",
                          c.trainer.epochs ? str_cat(*c.trainer.epochs, " epoch(s)")
                                           : str_cat(c.trainer.steps, " steps"),
                          " on ", c.trainer.device.str(), ", seed ", c.trainer.seed));
  std::string data =
      str_cat("data: ", data::expand_glob(c.data.train).size(), " training shard(s)");
  if (!c.data.val.empty())
    data += str_cat(", ", data::expand_glob(c.data.val).size(), " validation shard(s)");
  lines.push_back(data);
  lines.push_back(str_cat("logs: ", c.trainer.log_dir, "; checkpoints: ",
                          c.trainer.checkpoint_dir.empty() ? "none" : c.trainer.checkpoint_dir));
  return lines;
}

}  // namespace tessera::train
