// estimate_memory: model-state memory per rank under ZeRO stages 0-3 for a GPT, before a
// run: Tessera's fp32 and fp16/bf16 training (parallel/zero/memory_estimate.h) and
// DeepSpeed's own estimators for mixed-precision GPU training.
//
//   bazel run //tools:estimate_memory -- --model gpt2-xl --world 1,2,4,8
//   bazel run //tools:estimate_memory -- --config configs/gpt2_124m.json
//
// Exit codes: 0 done, 2 bad flags, 1 any other error (a bad config names its JSON path).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/gpt2/config.h"
#include "models/gpt2/spec.h"
#include "parallel/zero/memory_estimate.h"
#include "tools/cli/flags.h"
#include "tools/trainer/run_config.h"

namespace {

// The GPT a run config trains; throws for another model kind.
tessera::GptConfig gpt_of(const tessera::train::RunConfig& run) {
  const auto* gpt = dynamic_cast<const tessera::GptSpec*>(run.model.get());
  TS_CHECK(gpt != nullptr, "[estimate_memory] ", run.source, ": expected a gpt2 model, found \"",
           run.model->type(), "\"");
  return gpt->config();
}

constexpr const char* kUsage =
    R"(usage: estimate_memory [--model NAME | --config FILE] [--world LIST]
                       [--gpus-per-node G] [--nodes N]

Prints the model-state bytes per rank at ZeRO stages 0-3 for each data-parallel world size.

  --model NAME        gpt2 | gpt2-medium | gpt2-large | gpt2-xl (default gpt2)
  --config FILE       a run config: its `model` section gives the GPT
  --world LIST        data-parallel world sizes, comma-separated (default 1,2,4)
  --gpus-per-node G   for DeepSpeed's estimates: GPUs per node (default: each world size
                      on one node)
  --nodes N           for DeepSpeed's estimates: nodes (default 1)
)";

double gib(double bytes) { return bytes / (1 << 30); }

int body(int argc, char** argv) {
  using namespace tessera;
  const cli::Flags flags(argc, argv,
                         {{"model", cli::Flag::kValue},
                          {"config", cli::Flag::kValue},
                          {"world", cli::Flag::kValue},
                          {"gpus-per-node", cli::Flag::kValue},
                          {"nodes", cli::Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (flags.has("model") && flags.has("config")) {
    throw cli::UsageError("--model and --config are exclusive; give one");
  }
  cli::enter_working_directory();
  const std::string source =
      flags.has("config") ? flags.required("config") : "preset " + flags.get("model", "gpt2");
  const GptConfig model = flags.has("config")
                              ? gpt_of(train::load_run_config(flags.required("config")))
                              : GptConfig::preset(flags.get("model", "gpt2"));
  const std::vector<int64_t> worlds = flags.get_int_list("world", "1,2,4");
  for (const int64_t w : worlds) {
    if (w < 1 || w > (1 << 20)) {
      throw cli::UsageError("--world expected sizes in 1..1048576, found " + std::to_string(w));
    }
  }
  const int64_t nodes = flags.get_int("nodes", 1);
  const int64_t gpus_per_node_flag = flags.get_int("gpus-per-node", 0);
  if (nodes < 1 || gpus_per_node_flag < 0) {
    throw cli::UsageError("--nodes and --gpus-per-node expected positive integers");
  }

  const int64_t params = model.num_parameters();
  // Expert parallelism: each rank holds 1 / ep of the experts, sharded over world / ep ranks.
  const int64_t ep = model.moe ? model.moe->ep_size : 1;
  const int64_t experts = ep > 1 ? model.expert_parameters() : 0;
  // A per-rank estimate in GiB of `bytes(stage, params, world)` with the experts split that
  // way (Note [Expert model states]); -1 where ep does not divide the world.
  const auto per_rank = [&](const auto& bytes, int stage, int world) -> double {
    if (world % ep != 0) return -1;
    return gib(parallel::expert_split_model_state_bytes(
        [&](int64_t p, int w) { return bytes(stage, p, w); }, params, experts, world,
        static_cast<int>(ep)));
  };
  const auto fp32_bytes = [](int stage, int64_t p, int world) {
    return parallel::fp32_model_state_bytes(stage, p, world);
  };
  const auto mixed_bytes = [](int stage, int64_t p, int world) {
    return parallel::mixed_model_state_bytes(stage, p, world, false);
  };
  const int64_t c = model.n_embd;
  // DeepSpeed's L: the largest module's parameters; in a GPT-2 the token embedding.
  const int64_t largest = std::max(
      {model.padded_vocab_size() * c, model.block_size * c, 4 * c * c + (model.bias ? 4 * c : 0)});
  std::printf("%s: %lld parameters, largest layer %lld\n", source.c_str(),
              static_cast<long long>(params), static_cast<long long>(largest));
  if (experts > 0) {
    std::printf(
        "%lld of them experts, split over expert groups of ep_size %lld (a rank holds 1 / %lld\n"
        "of them, sharded over world / %lld ranks); '-': a world that ep_size does not divide\n",
        static_cast<long long>(experts), static_cast<long long>(ep), static_cast<long long>(ep),
        static_cast<long long>(ep));
  }
  std::printf("\n");

  std::printf(
      "Tessera fp32 training, model states per rank in GiB (parameters 4, gradients 4,\n"
      "Adam moments 8 bytes per parameter; stage s shards ceil(P / world) each):\n");
  std::printf("%8s %10s %10s %10s %10s\n", "world", "stage 0", "stage 1", "stage 2", "stage 3");
  for (const int world : worlds) {
    std::printf("%8d", world);
    for (int stage = 0; stage <= 3; ++stage) {
      const double g = per_rank(fp32_bytes, stage, world);
      g < 0 ? std::printf(" %10s", "-") : std::printf(" %10.3f", g);
    }
    std::printf("\n");
  }

  std::printf(
      "\nTessera fp16/bf16 training, model states per rank in GiB (16-bit parameters 2 and\n"
      "gradients 2 (stages 0-1), f32 gradients 4, masters 4, Adam moments 8 bytes per\n"
      "parameter; stage 3 adds no 16-bit gradient buffer and shards the parameters too):\n");
  std::printf("%8s %10s %10s %10s %10s\n", "world", "stage 0", "stage 1", "stage 2", "stage 3");
  for (const int world : worlds) {
    std::printf("%8d", world);
    for (int stage = 0; stage <= 3; ++stage) {
      const double g = per_rank(mixed_bytes, stage, world);
      g < 0 ? std::printf(" %10s", "-") : std::printf(" %10.3f", g);
    }
    std::printf("\n");
  }
  std::printf("(bf16 at stage 1 with gradient_accumulation_steps > 1 sums in fp32: + %.3f GiB)\n",
              gib(4.0 * static_cast<double>(params - experts + experts / ep)));
  if (experts > 0) {
    std::printf(
        "\nNo offload or DeepSpeed estimates: offload is refused with expert parallelism, and\n"
        "DeepSpeed's estimators count every expert on every GPU.\n");
    return 0;
  }

  std::printf(
      "\nThe same with offload_optimizer \"nvme\", in memory / in the swap file, GiB per rank\n"
      "(Note [Offloaded model states]: moments, masters and, at stages 2-3, f32 gradients on\n"
      "NVMe; a step brings one sub-group in; the last column adds offload_param \"nvme\", the\n"
      "16-bit shard, which gathers bring in a parameter at a time):\n");
  std::printf("%8s %17s %17s %17s %17s\n", "world", "stage 1", "stage 2", "stage 3",
              "stage 3 + params");
  for (const int world : worlds) {
    std::printf("%8d", world);
    for (int column = 1; column <= 4; ++column) {
      const int stage = std::min(column, 3);
      const int64_t total = parallel::mixed_model_state_bytes(stage, params, world, false);
      const int64_t nvme =
          parallel::nvme_model_state_bytes(stage, params, world, true, true, column == 4);
      std::printf(" %8.3f / %6.3f", gib(static_cast<double>(total - nvme)),
                  gib(static_cast<double>(nvme)));
    }
    std::printf("\n");
  }

  std::printf(
      "\nDeepSpeed's estimators (fp16 training, buffer factor 1.5), device / host GiB per "
      "GPU:\n");
  std::printf("%8s %8s %17s %17s %17s %17s %17s\n", "GPUs", "nodes", "Z2 cpu offload", "Z2",
              "Z3 offload all", "Z3 offload opt", "Z3");
  for (const int world : worlds) {
    const int gpus_per_node = gpus_per_node_flag > 0 ? static_cast<int>(gpus_per_node_flag) : world;
    const int n = static_cast<int>(nodes);
    const parallel::DeviceHostBytes cells[] = {
        parallel::deepspeed_zero2_estimate(params, gpus_per_node, n, true),
        parallel::deepspeed_zero2_estimate(params, gpus_per_node, n, false),
        parallel::deepspeed_zero3_estimate(params, largest, gpus_per_node, n, true, true, true),
        parallel::deepspeed_zero3_estimate(params, largest, gpus_per_node, n, false, true, true),
        parallel::deepspeed_zero3_estimate(params, largest, gpus_per_node, n, false, false, true),
    };
    std::printf("%8d %8d", gpus_per_node * n, n);
    for (const parallel::DeviceHostBytes& cell : cells) {
      std::printf(" %8.2f / %6.2f", gib(cell.device), gib(cell.host));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::run_tool("estimate_memory", kUsage, body, argc, argv);
}
