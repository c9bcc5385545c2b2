// Pipelines, tensor slicing, ZeRO-3 and expert parallelism with CUDA tensors, through the
// trainer, against the same layout on the CPU: several thread ranks share one GPU over host staging
// (parallel/comm/host_staged_comm.h), as NCCL refuses two ranks on one device; with two
// GPUs, three layouts of two ranks run over NCCL, one GPU per rank, as tools/train does
// under mpirun, and each overlapped mode there gives its blocking run's bits. The 3D groups are
// split from the device group (tools/trainer/trainer.h), so every stage transfer, partial sum and
// gathered parameter moves CUDA tensors; one layout cuts its micro-batches in two (Note
// [Batch-split overlap] in models/gpt2/batch_split.h). 16-bit layouts with cuDNN's attention
// are held to the one-process GPU run.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/cuda/kernels.h"
#include "parallel/comm/host_staged_comm.h"
#include "parallel/comm/nccl_comm.h"
#include "parallel/comm/thread_comm.h"
#include "tests/gpu/cycle_shards.h"
#include "tests/test_files.h"
#include "tests/tools/trainer/run_metrics.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/run_config.h"
#include "tools/trainer/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int64_t kVocab = testing::kCycleVocab;

struct Layout {
  int pipe, data, model, zero;
  std::string precision;  // "fp32", "bf16" or "fp16"
  int ep = 0;             // > 0: a GPT-MoE whose experts split over ep_size = ep ranks
  int batch_split = 1;    // tensor_parallel.batch_split
  int ranks() const { return pipe * data * model; }
};

// 8 AdamW steps of 8 sequences of 16 in 2 micro-batches per data rank on `layout`, on
// `device`, evaluating every 4 steps and checkpointing at the end. No dropout and no
// biases (the key bias's gradient is rounding noise that Adam turns into full steps).
Json run_config(const fs::path& data, const fs::path& dir, const Layout& layout,
                const std::string& device) {
  Json doc = {
      {"train_batch_size", 8},
      {"gradient_accumulation_steps", 2},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.1}}}}},
      {"zero_optimization", {{"stage", layout.zero}, {"stage3_param_persistence_threshold", 100}}},
      {"pipeline", {{"stages", layout.pipe}, {"partition_method", "uniform"}}},
      {"tensor_parallel", {{"tp_size", layout.model}}},
      {"model",
       {{"type", "gpt2"},
        {"vocab_size", kVocab},
        {"block_size", 16},
        {"n_layer", 2},
        {"n_head", 4},
        {"n_embd", 32},
        {"bias", false}}},
      {"data",
       {{"train", (data / "train_*.bin").string()},
        {"val", (data / "val_*.bin").string()},
        {"sampling", "random"}}},
      {"trainer",
       {{"steps", 8},
        {"eval_interval", 4},
        {"eval_batches", 2},
        {"seed", 5},
        {"threads", 1},
        {"device", device},
        {"log_dir", dir.string()},
        {"checkpoint_dir", (dir / "ckpt").string()},
        {"checkpoint_interval", 8},
        {"keep_last", 0}}}};
  // 4 experts, top-2, in the second block (Note [GPT-MoE] in models/gpt2/moe_config.h).
  if (layout.ep > 0) doc["model"]["moe"] = {{"num_experts", 4}, {"k", 2}, {"ep_size", layout.ep}};
  if (layout.batch_split > 1) doc["tensor_parallel"]["batch_split"] = layout.batch_split;
  if (layout.precision == "bf16") doc["bf16"] = {{"enabled", true}};
  if (layout.precision == "fp16") doc["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  return doc;
}

// How the ranks of a CUDA run reach their device.
enum class DeviceGroup { host_staged, nccl };

// Trains `doc` on `ranks` thread ranks. A CUDA run's ranks get a device group over the
// same ranks: host staging over a thread group of its own (all ranks on cuda:0), or NCCL
// with rank r on cuda:r. A rank that waits 60 s for its peers fails, naming the operation
// and the group (these runs take seconds), so that a hang is reported, not timed out.
void train(const Json& doc, const fs::path& dir, int ranks, DeviceGroup how) {
  parallel::CommOptions options;
  options.timeout = std::chrono::seconds(60);
  const std::vector<std::unique_ptr<parallel::Communicator>> staging =
      parallel::make_thread_group(ranks, options);
  parallel::run_thread_ranks(
      ranks,
      [&](parallel::Communicator& world) {
        RunConfig cfg = parse_run_config(doc, "test", dir.string(), ranks);
        std::unique_ptr<parallel::Communicator> device;
        if (cfg.trainer.device.is_cuda() && ranks > 1) {
          if (how == DeviceGroup::nccl) {
            cfg.trainer.device = Device::cuda(world.rank());
            device = parallel::nccl_group(world, world.rank(), {});
          } else {
            device = parallel::host_staged(*staging[world.rank()]);
          }
        }
        apply_run_environment(cfg, world, device.get());
        Trainer trainer(std::move(cfg), ResumeMode::never, world, device.get());
        trainer.run();
      },
      options);
}

// `got` learns as `want` does: it learns at all, and every training and validation loss is
// within `tol` relative of want's.
void check_losses_follow(const testing::RunMetrics& want, const testing::RunMetrics& got,
                         double tol) {
  REQUIRE(want.losses.size() == 8);
  REQUIRE(want.losses.at(8) < 0.9 * want.losses.at(1));  // it learns
  REQUIRE(got.losses.size() == want.losses.size());
  for (const auto& [step, loss] : want.losses) {
    INFO("step " << step << ": want " << loss << ", got " << got.losses.at(step));
    CHECK(std::abs(got.losses.at(step) - loss) <= tol * loss);
  }
  REQUIRE(got.val_losses.size() == want.val_losses.size());
  for (const auto& [step, loss] : want.val_losses) {
    INFO("validation at step " << step);
    CHECK(std::abs(got.val_losses.at(step) - loss) <= tol * loss);
  }
}

// The final weights of the run in `got` within `tol` relative L2 of those in `want`, per
// tensor (checkpoints merge pipeline stages and slices); warns the largest, under `name`.
void check_weights_follow(const fs::path& want, const fs::path& got, double tol,
                          const std::string& name) {
  auto weights = [](const fs::path& dir) {
    std::map<std::string, std::vector<double>> m;
    const CheckpointContents c =
        load_checkpoint(*CheckpointDir((dir / "ckpt").string(), 0).latest());
    for (const auto& [key, t] : c.model) m[key] = t.to_vector<double>();
    return m;
  };
  const std::map<std::string, std::vector<double>> w = weights(want), g = weights(got);
  REQUIRE(g.size() == w.size());
  double worst = 0;
  std::string worst_key;
  for (const auto& [key, b] : w) {
    INFO(key);
    const std::vector<double>& a = g.at(key);
    REQUIRE(a.size() == b.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < b.size(); ++i)
      diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
    CHECK(std::sqrt(diff) <= tol * std::sqrt(norm));
    if (std::sqrt(diff) > worst * std::sqrt(norm)) worst = std::sqrt(diff / norm), worst_key = key;
  }
  WARN(name << ": largest relative L2 error of the final weights against the reference run: "
            << worst << " (" << worst_key << ")");
}

// The CUDA run of `layout` follows its CPU run: every training and validation loss within
// `tol` relative, the final weights within `tol` relative L2.
void check_follows_cpu(const fs::path& root, const Layout& layout, DeviceGroup how) {
  const std::string name = std::to_string(layout.pipe) + std::to_string(layout.data) +
                           std::to_string(layout.model) + "_z" + std::to_string(layout.zero) + "_" +
                           layout.precision + "_ep" + std::to_string(layout.ep) + "_s" +
                           std::to_string(layout.batch_split);
  const fs::path cpu = root / (name + "_cpu");
  const fs::path gpu = root / (name + (how == DeviceGroup::nccl ? "_nccl" : "_staged"));
  train(run_config(root / "data", cpu, layout, "cpu"), cpu, layout.ranks(), how);
  train(run_config(root / "data", gpu, layout, "cuda"), gpu, layout.ranks(), how);
  const testing::RunMetrics want = testing::read_run_metrics(cpu);
  const testing::RunMetrics got = testing::read_run_metrics(gpu);
  // f32 runs follow closely (TF32 is off: see use_cpu_like_products); 16-bit runs round their
  // products at other places on the device and the CPU (measured on an H200: 0.3-0.9%).
  const double tol = layout.precision == "fp32" ? 1e-3 : 5e-2;
  check_losses_follow(want, got, tol);
  check_weights_follow(cpu, gpu, tol, name);
}

// cuBLAS runs f32 GEMMs on TF32 tensor cores (10-bit mantissas, kernels/cuda/matmul.cu), about
// 1e-3 relative per product off the CPU's f32, and eight AdamW steps at lr 1e-2 turn that into
// 3% of the final weights in every layout, with or without slicing (measured on an H200), which
// would hide a real difference between layouts. With NVIDIA_TF32_OVERRIDE=0, which cuBLAS reads
// when it makes its first handle, every f32 layout followed its CPU run within 4e-5. Each test
// case calls it first (no thread runs yet), before anything in this process touches cuBLAS;
// the other gpu tests cover TF32. For the same reason 16-bit runs keep attention on the flash
// kernels (TESSERA_CUDNN_ATTENTION=0, read when a thread first runs attention): cuDNN's
// fused attention rounds the probabilities and dS to 16 bits before its products, and the
// eight steps turned that into 5-13% of the attention weights in bf16 layouts, sliced or
// not (an H200), against 0.3-0.9% with f32 probabilities as on the CPU.
// tests/gpu/cudnn_attention_gpu_test.cc checks cuDNN's attention; the kit's 3D training run
// uses it in a pipelined, sliced layout.
void use_cpu_like_products() {
  ::setenv("NVIDIA_TF32_OVERRIDE", "0", 1);
  ::setenv("TESSERA_CUDNN_ATTENTION", "0", 1);
}

TEST_CASE("pipelines, tensor slicing and ZeRO-3 on one GPU follow the CPU", "[gpu][3d]") {
  use_cpu_like_products();
  REQUIRE(cuda::device_count() > 0);
  const fs::path root = testing::fresh_dir("parallel_modes_gpu_staged");
  testing::write_cycle_shards(root / "data");
  for (const Layout& l :
       {Layout{2, 1, 2, 1, "fp32"}, Layout{2, 1, 2, 1, "bf16"}, Layout{2, 2, 1, 1, "fp16"},
        Layout{1, 2, 2, 2, "fp32"}, Layout{1, 2, 1, 3, "fp32"}, Layout{1, 2, 1, 3, "bf16"},
        Layout{2, 1, 2, 1, "bf16", 0, 2}}) {
    DYNAMIC_SECTION("(" << l.pipe << ", " << l.data << ", " << l.model << "), ZeRO " << l.zero
                        << ", " << l.precision << ", batch split " << l.batch_split) {
      check_follows_cpu(root, l, DeviceGroup::host_staged);
    }
  }
}

// Whether cuDNN's fused attention takes this model's attention (T 16, D 8) on this machine,
// forward and backward; asked on a thread of its own, which reads TESSERA_CUDNN_ATTENTION.
bool cudnn_takes_tiny_attention() {
  bool takes = false;
  std::thread([&] {
    Generator gen(7);
    const Tensor q = randn({1, 4, 16, 8}, gen).to(DType::bf16).to(Device::cuda(0));
    const std::optional<kernels::AttentionOutput> f =
        kernels::cuda::cudnn_causal_attention(q, q, q, 0.35);
    takes =
        f && kernels::cuda::cudnn_causal_attention_backward(f->out, q, q, q, f->out, f->lse, 0.35);
  }).join();
  return takes;
}

// With cuDNN's attention (16-bit probabilities, unlike the CPU), each 16-bit layout against
// the one-process GPU run of the same precision: the layouts' own effect, without the CPU's
// f32 probabilities in the comparison. Not yet run on a GPU: its tolerance is the CPU
// comparison's.
TEST_CASE("16-bit layouts with cuDNN's attention follow the one-process GPU run", "[gpu][3d]") {
  use_cpu_like_products();  // cuBLAS's TF32 setting is the process's first handle's
  ::setenv("TESSERA_CUDNN_ATTENTION", "1", 1);  // read by each new rank thread
  REQUIRE(cuda::device_count() > 0);
  if (!cudnn_takes_tiny_attention()) {
    WARN("cuDNN's fused attention does not take (1, 4, 16, 8) bf16 here: nothing to compare");
    return;
  }
  const fs::path root = testing::fresh_dir("parallel_modes_gpu_cudnn");
  testing::write_cycle_shards(root / "data");
  for (const Layout& l :
       {Layout{2, 1, 2, 1, "bf16"}, Layout{1, 2, 1, 3, "bf16"}, Layout{2, 2, 1, 1, "fp16"}}) {
    DYNAMIC_SECTION("(" << l.pipe << ", " << l.data << ", " << l.model << "), ZeRO " << l.zero
                        << ", " << l.precision) {
      const std::string name = std::to_string(l.pipe) + std::to_string(l.data) +
                               std::to_string(l.model) + "_z" + std::to_string(l.zero) + "_" +
                               l.precision;
      const fs::path want_dir = root / ("111_" + l.precision);
      train(run_config(root / "data", want_dir, Layout{1, 1, 1, 0, l.precision}, "cuda"), want_dir,
            1, DeviceGroup::host_staged);
      const fs::path got_dir = root / name;
      train(run_config(root / "data", got_dir, l, "cuda"), got_dir, l.ranks(),
            DeviceGroup::host_staged);
      check_losses_follow(testing::read_run_metrics(want_dir), testing::read_run_metrics(got_dir),
                          5e-2);
      check_weights_follow(want_dir, got_dir, 5e-2, name + " against one process");
    }
  }
}

TEST_CASE("expert parallelism on one GPU follows the CPU", "[gpu][moe]") {
  use_cpu_like_products();
  REQUIRE(cuda::device_count() > 0);
  const fs::path root = testing::fresh_dir("expert_parallel_gpu_staged");
  testing::write_cycle_shards(root / "data");
  // The token all-to-alls, the expert-data group's reductions and ZeRO-3's expert gathers
  // move CUDA tensors through host staging (Note [Expert parameters] in
  // parallel/zero/zero_optimizer.h).
  for (const Layout& l : {Layout{1, 2, 1, 1, "fp32", 2}, Layout{1, 4, 1, 2, "bf16", 2},
                          Layout{1, 4, 1, 3, "fp32", 4}}) {
    DYNAMIC_SECTION("data " << l.data << ", ep_size " << l.ep << ", ZeRO " << l.zero << ", "
                            << l.precision) {
      check_follows_cpu(root, l, DeviceGroup::host_staged);
    }
  }
}

TEST_CASE("a pipeline and tensor slicing over NCCL on two GPUs follow the CPU", "[gpu][3d][nccl]") {
  use_cpu_like_products();
  if (cuda::device_count() < 2) {
    WARN("skipped: needs two CUDA devices, found " << cuda::device_count());
    return;
  }
  const fs::path root = testing::fresh_dir("parallel_modes_gpu_nccl");
  testing::write_cycle_shards(root / "data");
  for (const Layout& l :
       {Layout{2, 1, 1, 0, "fp32"}, Layout{1, 1, 2, 1, "bf16"}, Layout{1, 2, 1, 3, "fp32"}}) {
    DYNAMIC_SECTION("(" << l.pipe << ", " << l.data << ", " << l.model << "), ZeRO " << l.zero
                        << ", " << l.precision) {
      check_follows_cpu(root, l, DeviceGroup::nccl);
    }
  }
}

// Note [Device-queued operations]: overlapped operations are queued on NCCL's stream while
// backward and forward go on: ZeRO's reductions and gathers (stages 1-3), a pipeline's stage
// transfers, tensor slicing's input-gradient sums. Same operations, same order, same bits.
TEST_CASE("overlapped communication over NCCL gives the blocking run's bits",
          "[gpu][zero][nccl][async]") {
  use_cpu_like_products();  // whichever test case runs first makes cuBLAS's handle
  if (cuda::device_count() < 2) {
    WARN("skipped: needs two CUDA devices, found " << cuda::device_count());
    return;
  }
  const fs::path root = testing::fresh_dir("parallel_modes_gpu_overlap");
  testing::write_cycle_shards(root / "data");
  struct Case {
    Layout layout;
    const char* section;  // whose overlap switch
    const char* key;
  };
  for (const Case& c : {Case{{1, 2, 1, 1, "bf16"}, "zero_optimization", "overlap_comm"},
                        Case{{1, 2, 1, 2, "bf16"}, "zero_optimization", "overlap_comm"},
                        Case{{1, 2, 1, 3, "bf16"}, "zero_optimization", "overlap_comm"},
                        Case{{2, 1, 1, 0, "fp32"}, "pipeline", "overlap_transfers"},
                        Case{{1, 1, 2, 1, "fp32"}, "tensor_parallel", "overlap_comm"}}) {
    const Layout& layout = c.layout;
    DYNAMIC_SECTION("(" << layout.pipe << ", " << layout.data << ", " << layout.model << "), ZeRO "
                        << layout.zero << ", " << c.section << "." << c.key) {
      std::map<bool, testing::RunMetrics> metrics;
      for (bool overlap : {false, true}) {
        const fs::path dir = root / (std::string(c.section) + std::to_string(layout.zero) +
                                     (overlap ? "_on" : "_off"));
        Json doc = run_config(root / "data", dir, layout, "cuda");
        doc[c.section][c.key] = overlap;
        train(doc, dir, layout.ranks(), DeviceGroup::nccl);
        metrics[overlap] = testing::read_run_metrics(dir);
      }
      REQUIRE(metrics[false].losses.size() == 8);
      CHECK(metrics[true].losses == metrics[false].losses);
      CHECK(metrics[true].val_losses == metrics[false].val_losses);
    }
  }
}

}  // namespace
}  // namespace tessera::train
