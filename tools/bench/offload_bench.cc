// offload_bench: NVMe offload of the optimizer state (Note [ZeRO's offloaded state] in
// parallel/zero/zero_offload.h) against its references, measured in the same run.
//
//   bazel run //tools/bench:offload_bench -- [--dir DIR] [--disk-mb 512] [--steps 6]
//
// 1. The disk: --disk-mb written to a file in --dir and read back with direct I/O at the
//    aio settings offload uses (core/direct_file.h), the median of three rounds each.
// 2. CPU AdamW: Tessera's step (kernels/adamw.h) on one f32 parameter of --adam-params
//    elements (aligned, so in place: ZeRO's master chunks at offsets of a shard take the
//    staged path of Note [AdamW in cache-sized blocks]), in parameters per second, against
//    torch.optim.AdamW on the same machine
//    (tools/bench/adamw_torch.py, the same threads). DeepSpeed reports its CPU Adam 5-7x
//    faster than PyTorch's (the ZeRO-Offload paper, Rajbhandari et al. 2021, section 5).
// 3. The step: a bf16 GPT at ZeRO stage 1 on one rank, its optimizer state and f32 masters
//    in memory, on NVMe (offload_optimizer "nvme" in --dir) as one sub-group, and on NVMe
//    in six sub-groups with pipeline_read and pipeline_write, in alternating rounds. Each
//    step reads and writes 12 bytes per parameter (masters, exp_avg, exp_avg_sq); the
//    bound for the offloaded step's extra time is those bytes at the measured read and
//    write bandwidths, one after the other (a disk that reads while it writes, or writes
//    hidden under the next forward pass, beat it), and the target is an extra time within
//    1.5x of it.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/direct_file.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/adamw.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tools/bench/python_reference.h"
#include "tools/bench/stats.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage: offload_bench [--dir DIR] [--disk-mb N] [--adam-params N]
                     [--steps N] [--threads N] [--python EXE] [--torch-script FILE] [--no-torch]

NVMe offload of the optimizer state: the disk's direct-I/O bandwidth, CPU AdamW against
PyTorch's, and a bf16 step with its optimizer state on disk against in memory.

  --dir DIR            where the test file and the swap files go (default: $TMPDIR or /tmp)
  --disk-mb N          megabytes written and read in the disk test (default 512)
  --adam-params N      elements of the AdamW test (default 20000000)
  --steps N            timed steps per mode (default 6, rounded up to even)
  --threads N          threads (default 2)
  --python EXE         the interpreter with torch (default /usr/bin/python3)
  --torch-script FILE  the reference (default: tools/bench/adamw_torch.py)
  --no-torch           skip the PyTorch reference
  --help               print this and exit
)";

struct Disk {
  double write_gbs = 0, read_gbs = 0;  // 1e9 bytes per second
};

Disk measure_disk(const fs::path& dir, int64_t bytes) {
  const std::string path =
      (dir / ("offload_bench_" + std::to_string(::getpid()) + ".tmp")).string();
  AlignedBuffer buffer(bytes);
  std::vector<double> writes, reads;
  {
    DirectFile file(path, AioConfig{});
    for (int round = 0; round < 3; ++round) {
      auto start = Clock::now();
      file.start_write(0, buffer.data(), buffer.bytes());
      file.wait();
      writes.push_back(static_cast<double>(buffer.bytes()) / seconds_since(start) / 1e9);
      start = Clock::now();
      file.start_read(0, buffer.data(), buffer.bytes());
      file.wait();
      reads.push_back(static_cast<double>(buffer.bytes()) / seconds_since(start) / 1e9);
    }
  }
  fs::remove(path);
  return {bench::median(writes), bench::median(reads)};
}

double adamw_params_per_s(int64_t n, int steps) {
  Generator gen(0);
  Tensor w = randn({n}, gen), g = randn({n}, gen), m = zeros({n}), v = zeros({n});
  std::vector<double> times;
  for (int s = 0; s < steps + 2; ++s) {
    const kernels::AdamWParams p{1e-3, 0.9, 0.999, 1e-8, 0.1, s + 1, true, true};
    const auto start = Clock::now();
    kernels::adamw_step(w, g, m, v, p);
    if (s >= 2) times.push_back(seconds_since(start));
  }
  return static_cast<double>(n) / bench::median(times);
}

GptConfig model_config() {
  GptConfig c;
  c.vocab_size = 4096;
  c.block_size = 64;
  c.n_layer = 6;
  c.n_head = 8;
  c.n_embd = 512;
  return c;
}

// The step's modes: the optimizer state in memory, on NVMe, and on NVMe with DeepSpeed's
// pipeline_read and pipeline_write over kSubGroups sub-groups.
enum Mode { kInMemory, kNvme, kPipelined, kModes };
constexpr int64_t kSubGroups = 6;

// Median step seconds per mode, in alternating rounds of an untimed step and two timed ones.
std::vector<double> time_steps(const fs::path& dir, int rounds) {
  std::vector<std::vector<double>> times(kModes);
  parallel::run_thread_ranks(1, [&](parallel::Communicator& comm) {
    const GptConfig cfg = model_config();
    std::vector<std::unique_ptr<Gpt>> models;
    std::vector<std::unique_ptr<parallel::ZeroOptimizer>> opts;
    const int64_t params = cfg.num_parameters();
    for (int mode = 0; mode < kModes; ++mode) {
      models.push_back(std::make_unique<Gpt>(cfg, 1));
      models.back()->to(Device::cpu(), DType::bf16);
      parallel::ZeroConfig zero;
      zero.stage = 1;
      // Blocks of a twentieth of the model in every mode, so that sub-groups can be formed.
      zero.reduce_bucket_size = params / 20;
      if (mode != kInMemory) {
        zero.offload_optimizer.device = parallel::OffloadOptimizerConfig::Device::nvme;
        zero.offload_optimizer.nvme_path = dir.string();
      }
      if (mode == kPipelined) {
        zero.sub_group_size = params / kSubGroups;
        zero.offload_optimizer.pipeline_read = true;
        zero.offload_optimizer.pipeline_write = true;
      }
      parallel::MixedPrecision precision;
      precision.dtype = DType::bf16;
      optim::OptimizerConfig adamw;
      opts.push_back(std::make_unique<parallel::ZeroOptimizer>(
          comm, *models.back(),
          optim::decay_groups(models.back()->named_parameters(), adamw.lr, 0.1, true, {}), adamw,
          zero, precision));
    }
    Generator gen(17);
    const Tensor x =  // (4, T) token ids
        rand({4, cfg.block_size}, gen, {}, 0.0, static_cast<double>(cfg.vocab_size)).to(DType::i32);
    for (int round = 0; round < rounds; ++round) {
      for (size_t m = 0; m < kModes; ++m) {
        for (int s = 0; s < 3; ++s) {
          const auto start = Clock::now();
          opts[m]->zero_grad();
          opts[m]->backward(models[m]->loss(models[m]->forward(x), x), 1.0, true);
          opts[m]->clip_grad_norm(1.0);
          opts[m]->step();
          if (s > 0) times[m].push_back(seconds_since(start));
        }
      }
    }
  });
  std::vector<double> medians;
  for (const std::vector<double>& t : times) medians.push_back(bench::median(t));
  return medians;
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"dir", Flag::kValue},
                          {"disk-mb", Flag::kValue},
                          {"adam-params", Flag::kValue},
                          {"steps", Flag::kValue},
                          {"threads", Flag::kValue},
                          {"python", Flag::kValue},
                          {"torch-script", Flag::kValue},
                          {"no-torch", Flag::kSwitch}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const char* tmp = std::getenv("TMPDIR");
  const fs::path dir = flags.get("dir", tmp != nullptr ? tmp : "/tmp");
  const int64_t disk_mb = flags.get_int("disk-mb", 512);
  const int64_t adam_params = flags.get_int("adam-params", 20'000'000);
  const int rounds = static_cast<int>((flags.get_int("steps", 6) + 1) / 2);
  const int threads = static_cast<int>(flags.get_int("threads", 2));
  if (disk_mb < 1) throw cli::UsageError("--disk-mb expected at least 1");
  if (adam_params < 1) throw cli::UsageError("--adam-params expected at least 1");
  if (rounds < 1) throw cli::UsageError("--steps expected at least 1");
  if (threads < 1) throw cli::UsageError("--threads expected at least 1");
  set_num_threads(threads);

  const Disk disk = measure_disk(dir, disk_mb << 20);
  std::printf("disk (%s, direct I/O, aio defaults): write %.2f GB/s, read %.2f GB/s\n", dir.c_str(),
              disk.write_gbs, disk.read_gbs);

  const double ours = adamw_params_per_s(adam_params, 5);
  std::printf("CPU AdamW, %lld f32 parameters, %d threads: Tessera %.0f M params/s",
              static_cast<long long>(adam_params), threads, ours / 1e6);
  if (!flags.has("no-torch")) {
    const std::string script =
        bench::find_script(flags.get("torch-script"), argv[0], "adamw_torch.py");
    const bench::ScriptResult torch = bench::run_script(
        flags.get("python", "/usr/bin/python3"), script,
        "--params " + std::to_string(adam_params) + " --threads " + std::to_string(threads),
        "adamw_params_per_s");
    const double theirs = bench::json_number(torch.json, "adamw_params_per_s");
    if (torch.json) {
      std::printf(", torch.optim.AdamW %.0f M params/s: %.2fx\n", theirs / 1e6, ours / theirs);
    } else {
      std::printf("\n(no PyTorch reference: %s)\n", torch.why.c_str());
    }
  } else {
    std::printf("\n");
  }

  const int64_t params = model_config().num_parameters();
  const std::vector<double> step = time_steps(dir, rounds);
  const double swapped = 12.0 * static_cast<double>(params);  // bytes each way per step
  const double bound = swapped / (disk.read_gbs * 1e9) + swapped / (disk.write_gbs * 1e9);
  std::printf(
      "bf16 GPT, %lld parameters, ZeRO-1 on one rank: step %.1f ms in memory; %.0f MB read and "
      "written per step, %.1f ms at the disk's bandwidths\n",
      static_cast<long long>(params), step[kInMemory] * 1e3, swapped / 1e6, bound * 1e3);
  for (const Mode mode : {kNvme, kPipelined}) {
    const double extra = step[mode] - step[kInMemory];
    std::printf("  %-44s %.1f ms, extra %.1f ms: %.2fx the bound (target <= 1.5)\n",
                mode == kNvme ? "optimizer state on NVMe, one sub-group:"
                              : "on NVMe, 6 sub-groups, pipeline_read/write:",
                step[mode] * 1e3, extra * 1e3, extra / bound);
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool("offload_bench", tessera::kUsage, tessera::bench_main, argc, argv);
}
