// ZeRO with its optimizer state offloaded to NVMe swap files (Note [ZeRO's offloaded state]
// in parallel/zero/zero_offload.h) on thread ranks: f32 and bf16 at stages 1-3, one and
// three ranks, sub-groups of one block and of several, two micro-batches a step, clipped,
// equal the in-memory run bitwise; between steps the state and the 16-bit runs' f32 masters
// are out of memory, and at stages 2-3 the gradients are too once backward is over; a
// checkpoint's save and load round trip (whole, or streamed through a shard file: Note
// [Streamed checkpoints] in zero_optimizer.h, with one chunk or one sub-group in memory)
// continues bitwise; the swap file goes with the optimizer.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include "autograd/engine.h"
#include "core/allocator.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "models/io/safetensors.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/zero_optimizer.h"
#include "tests/parallel/zero_test_gpt.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

constexpr int kSteps = 4;
constexpr int64_t kGlobalRows = 12;  // per step, over all ranks and micro-batches
constexpr int64_t kGas = 2;
constexpr int64_t kT = 6;

struct Run {
  std::vector<double> losses, norms;
  std::vector<float> masters;        // whole_parameters(), flat
  std::vector<int64_t> state_bytes;  // the optimizer state in memory after each step
  std::vector<int64_t> param_bytes;  // the parameter buffers in memory after each step
  std::vector<int64_t> grad_bytes;   // the gradient buffers in memory after each backward
  std::vector<bool> stepped;         // false: skipped, its f16 gradients overflowed
  // The most bytes of swapped storages in memory during each step (mapped_host_allocator:
  // world 1 only, as thread ranks share it), and the bound: the largest sub-group's.
  std::vector<int64_t> step_swap_peak;
  std::vector<int64_t> step_start_swapped;  // mapped bytes as the step starts
  int64_t largest_sub_group = 0;
  std::vector<int64_t> nvme_bytes;  // the state and masters in the swap file after each step
  std::vector<int64_t> host_bytes;  // ModelStateBytes::on_host after each step
  std::vector<float> state;         // the state_dict's tensors, flat, at the end
  ModelStateBytes after_load;       // after the round trip (and swap_out_offloaded())
  // The streamed round trip: the shard file's f32 values, the most swapped bytes in memory
  // while it was written and while it was loaded (world 1), and the bounds: two f32 chunks
  // (the one written and the next one's read), and a sub-group with a chunk.
  std::vector<float> saved_shard;
  int64_t save_peak = 0, load_peak = 0;
  int64_t largest_chunk = 0;
};

// How the checkpoint round trip goes: after step 1, whole (whole_state_dict,
// whole_parameters and their loads, as another layout resumes), or through each rank's
// shard file (shard_pieces after step 1, load_shard after step 2, as the same layout
// resumes).
enum class RoundTrip { whole, shard };

// `world` ranks train the test GPT in `dtype` at `zero`; after step 1 each rank saves its
// state and parameters and loads them back (a checkpoint's round trip, `trip`).
std::vector<Run> train(int world, const ZeroConfig& zero, DType dtype,
                       RoundTrip trip = RoundTrip::whole) {
  const std::filesystem::path shards = testing::fresh_dir("zero_offload_shards");
  const Tensor rows = testing::zero_test_rows(kSteps * kGlobalRows, kT);
  std::vector<Run> runs(static_cast<size_t>(world));
  run_thread_ranks(world, [&](Communicator& comm) {
    Gpt model(testing::zero_test_gpt(kT), 99);
    model.to(Device::cpu(), dtype);
    MixedPrecision precision;
    precision.dtype = dtype;
    // fp16 starts with a loss scale its gradients overflow, so that steps are skipped with
    // their gradients in the swap file, as Adam's first steps in f16 often are.
    precision.scaler.initial_scale_power = 20;
    precision.scaler.hysteresis = 1;
    const optim::OptimizerConfig adamw = testing::zero_test_adamw();
    ZeroOptimizer opt(
        comm, model,
        optim::decay_groups(model.named_parameters(), adamw.lr, adamw.weight_decay, true, {}),
        adamw, zero, precision);
    Run& run = runs[static_cast<size_t>(comm.rank())];
    // Note [Offloaded model states]: what a sub-group brings in, per element of its chunks.
    const int64_t per_element = 8 + (dtype == DType::f32 ? 0 : 4) + (zero.stage >= 2 ? 4 : 0);
    int64_t group_numel = 0;
    for (const FlatLayout::Block& b : opt.layout().blocks) {
      if (group_numel >= zero.sub_group_size) group_numel = 0;  // a new sub-group
      group_numel += b.chunk;
      run.largest_sub_group = std::max(run.largest_sub_group, group_numel * per_element);
      run.largest_chunk = std::max(run.largest_chunk, b.chunk * 4);
    }
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      run.losses.push_back(
          testing::zero_test_backward(opt, model, rows, s, kGlobalRows, kGas, world, comm.rank()));
      run.grad_bytes.push_back(opt.model_state_bytes().grads);
      run.norms.push_back(opt.clip_grad_norm(1e-2));  // clips: the gradients are scaled
      mapped_host_allocator().reset_peak();
      // Gradients on their way to the swap file, whose memory the step lets go first.
      const int64_t leaving = mapped_host_allocator().stats().allocated;
      run.stepped.push_back(opt.step());
      run.step_swap_peak.push_back(mapped_host_allocator().stats().peak_allocated);
      run.step_start_swapped.push_back(leaving);
      opt.wait_for_parameters();
      run.state_bytes.push_back(opt.model_state_bytes().optimizer);
      run.param_bytes.push_back(opt.model_state_bytes().params);
      run.nvme_bytes.push_back(opt.model_state_bytes().on_nvme);
      run.host_bytes.push_back(opt.model_state_bytes().on_host);
      // The streamed trip saves after step 1 and loads after step 2, going back a step, so
      // that the loaded values differ from those they replace.
      const std::string file =
          (shards / ("shard_" + std::to_string(comm.rank()) + ".safetensors")).string();
      const auto peak_over = [](const std::function<void()>& f) {
        const int64_t base = mapped_host_allocator().stats().allocated;
        mapped_host_allocator().reset_peak();
        f();
        return mapped_host_allocator().stats().peak_allocated - base;
      };
      if (s == 1 && trip == RoundTrip::shard) {
        run.save_peak =
            peak_over([&] { write_streamed_safetensors(file, opt.shard_pieces(true)); });
      } else if (s == 2 && trip == RoundTrip::shard) {
        const SafetensorsFile saved = read_safetensors(file);  // mapped (Note [Mapped tensors])
        for (const auto& [k, t] : saved.tensors) {
          if (k != "step") {
            for (float v : t.to_vector<float>()) run.saved_shard.push_back(v);
          }
        }
        run.load_peak = peak_over([&] { opt.load_shard(saved.tensors); });
        run.after_load = opt.model_state_bytes();
      } else if (s == 1 && trip == RoundTrip::whole) {
        StateDict state, params;
        for (const auto& [k, t] : opt.whole_state_dict()) state.emplace_back(k, t.clone());
        for (const auto& [k, t] : opt.whole_parameters()) params.emplace_back(k, t.clone());
        opt.load_parameters(params);
        opt.load_whole_state(state);
        opt.swap_out_offloaded();  // what the round trip brought in goes back out
        run.after_load = opt.model_state_bytes();
      }
    }
    const StateDict whole = opt.whole_parameters();
    const std::map<std::string, Tensor> by_name(whole.begin(), whole.end());
    for (const NamedParameter& p : model.named_parameters()) {
      for (float v : by_name.at(p.name).to_vector<float>()) run.masters.push_back(v);
    }
    for (const auto& [k, t] : opt.state_dict()) {
      for (double v : t.to(DType::f64).to_vector<double>())
        run.state.push_back(static_cast<float>(v));
    }
  });
  return runs;
}

// The streamed round trip of an offloaded run: the same shard file as the in-memory run's,
// written with at most two chunks of swapped state in memory and loaded with at most a
// sub-group and a chunk (world 1: thread ranks share the allocator's counters).
void check_streamed(const Run& offloaded, const Run& in_memory, RoundTrip trip, int world) {
  if (trip != RoundTrip::shard) return;
  CHECK_FALSE(in_memory.saved_shard.empty());
  CHECK(offloaded.saved_shard == in_memory.saved_shard);
  if (world != 1) return;
  CHECK(offloaded.save_peak <= 2 * offloaded.largest_chunk);
  CHECK(offloaded.load_peak <= offloaded.largest_sub_group + offloaded.largest_chunk);
}

TEST_CASE("ZeRO with its optimizer state on NVMe equals the in-memory run bitwise",
          "[zero][offload]") {
  const std::filesystem::path dir = testing::fresh_dir("zero_offload");
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      for (const int world : {1, 3}) {
        for (const int64_t sub_group : {int64_t{1}, int64_t{1'000'000'000}}) {
          DYNAMIC_SECTION(dtype_name(dtype) << " stage " << stage << " world " << world
                                            << " sub_group_size " << sub_group) {
            ZeroConfig zero;
            zero.stage = stage;
            zero.reduce_bucket_size = 500;  // several blocks at stages 1-2
            zero.stage3_param_persistence_threshold = 0;
            zero.sub_group_size = sub_group;
            // Sub-groups of one block stream the round trip through shard files; larger
            // ones go whole.
            const RoundTrip trip = sub_group == 1 ? RoundTrip::shard : RoundTrip::whole;
            const std::vector<Run> memory = train(world, zero, dtype, trip);
            zero.offload_optimizer.device = OffloadOptimizerConfig::Device::nvme;
            zero.offload_optimizer.nvme_path = (dir / "swap").string();
            zero.aio.block_size = 8192;
            const std::vector<Run> nvme = train(world, zero, dtype, trip);
            for (int r = 0; r < world; ++r) {
              INFO("rank " << r);
              CHECK(nvme[r].losses == memory[r].losses);
              // Equal, NaN where both overflowed.
              CHECK(std::equal(nvme[r].norms.begin(), nvme[r].norms.end(), memory[r].norms.begin(),
                               memory[r].norms.end(), [](double a, double b) {
                                 return a == b || (std::isnan(a) && std::isnan(b));
                               }));
              CHECK(nvme[r].masters == memory[r].masters);
              CHECK(nvme[r].state == memory[r].state);
              CHECK(nvme[r].stepped == memory[r].stepped);
              // fp16 skips its first step at stages 1-2 (stage 3's gradients stay finite at
              // this scale), and steps after it.
              CHECK(memory[r].stepped.front() == (dtype != DType::f16 || stage == 3));
              CHECK(memory[r].stepped.back());
              bool any_step = false;
              for (int s = 0; s < kSteps; ++s) {
                INFO("step " << s);
                any_step = any_step || memory[r].stepped[s];
                CHECK((memory[r].state_bytes[s] > 0) == any_step);
                CHECK(nvme[r].state_bytes[s] == 0);  // all of it in the swap file
                CHECK(memory[r].nvme_bytes[s] == 0);
                CHECK(nvme[r].nvme_bytes[s] >= memory[r].state_bytes[s]);
                // The 16-bit runs' f32 masters went with it, and stages 2-3's gradients.
                const bool masters_out = dtype != DType::f32;
                CHECK((nvme[r].param_bytes[s] < memory[r].param_bytes[s]) == masters_out);
                CHECK(memory[r].grad_bytes[s] > 0);
                CHECK((nvme[r].grad_bytes[s] == 0) == (stage >= 2));
                if (world == 1) {
                  // One sub-group in memory at a time, whole in its turn.
                  CHECK(nvme[r].step_swap_peak[s] <=
                        std::max(nvme[r].largest_sub_group, nvme[r].step_start_swapped[s]));
                  // The state is the optimizer's own memory until it has been swapped once.
                  if (s == kSteps - 1 && dtype != DType::f16)
                    CHECK(nvme[r].step_swap_peak[s] >= nvme[r].largest_sub_group / 2);
                }
              }
              CHECK(nvme[r].after_load.optimizer == 0);
              // Loaded after step 1 (the whole trip), the file holds what it held then.
              if (trip == RoundTrip::whole)
                CHECK(nvme[r].after_load.on_nvme == nvme[r].nvme_bytes[1]);
              CHECK(nvme[r].after_load.on_nvme > 0);
              check_streamed(nvme[r], memory[r], trip, world);
            }
            if (sub_group == 1) {
              // DeepSpeed's pipelining overlaps a sub-group's I/O with its neighbours'
              // updates, holding up to three sub-groups, and changes no bits.
              zero.offload_optimizer.pipeline_read = true;
              zero.offload_optimizer.pipeline_write = true;
              const std::vector<Run> pipelined = train(world, zero, dtype, trip);
              for (int r = 0; r < world; ++r) {
                INFO("pipelined, rank " << r);
                CHECK(pipelined[r].losses == memory[r].losses);
                CHECK(pipelined[r].masters == memory[r].masters);
                CHECK(pipelined[r].state == memory[r].state);
                CHECK(pipelined[r].stepped == memory[r].stepped);
                check_streamed(pipelined[r], memory[r], trip, world);
                for (int s = 0; s < kSteps && world == 1; ++s) {
                  INFO("step " << s);
                  CHECK(pipelined[r].step_swap_peak[s] <=
                        std::max(3 * pipelined[r].largest_sub_group,
                                 pipelined[r].step_start_swapped[s]));
                }
              }
            }
            CHECK(std::filesystem::is_empty(dir / "swap"));  // the files went with the runs
          }
        }
      }
    }
  }
}

TEST_CASE("offload_optimizer \"cpu\" takes the GPU's host path with the in-memory bits",
          "[zero][offload]") {
  // Note [Offload on a GPU]: 16-bit parameters' masters step on the host from host copies
  // of the gradients; on the CPU both are in one memory, so the bits are equal.
  for (const DType dtype : {DType::bf16, DType::f16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      for (const int world : {1, 3}) {
        DYNAMIC_SECTION(dtype_name(dtype) << " stage " << stage << " world " << world) {
          ZeroConfig zero;
          zero.stage = stage;
          zero.reduce_bucket_size = 500;  // several blocks
          zero.stage3_param_persistence_threshold = 0;
          const std::vector<Run> memory = train(world, zero, dtype, RoundTrip::shard);
          zero.offload_optimizer.device = OffloadOptimizerConfig::Device::cpu;
          const std::vector<Run> host = train(world, zero, dtype, RoundTrip::shard);
          for (int r = 0; r < world; ++r) {
            INFO("rank " << r);
            CHECK(host[r].losses == memory[r].losses);
            CHECK(host[r].masters == memory[r].masters);
            CHECK(host[r].state == memory[r].state);
            CHECK(host[r].stepped == memory[r].stepped);
            check_streamed(host[r], memory[r], RoundTrip::shard, world);
            for (int s = 0; s < kSteps; ++s) {
              INFO("step " << s);
              // The masters and the state are counted as host memory, not the device's.
              CHECK(host[r].state_bytes[s] == 0);
              CHECK(host[r].param_bytes[s] < memory[r].param_bytes[s]);
              CHECK(host[r].param_bytes[s] > 0);  // the 16-bit parameters
              CHECK(host[r].host_bytes[s] ==
                    memory[r].state_bytes[s] + memory[r].param_bytes[s] - host[r].param_bytes[s]);
              CHECK(memory[r].host_bytes[s] == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("offload_optimizer's config: devices, paths and what is not implemented",
          "[zero][offload]") {
  const auto parse = [](const std::string& json) {
    const nlohmann::json doc = nlohmann::json::parse(json);
    JsonObjectReader r(doc, "test");
    return parse_zero_config(r.object("zero_optimization"));
  };
  CHECK(parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
        "nvme_path": "/tmp/x"}}})")
            .offload_optimizer.device == OffloadOptimizerConfig::Device::nvme);
  const ZeroConfig pipelined = parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer":
        {"device": "nvme", "nvme_path": "/tmp/x", "pipeline_read": true, "pipeline_write": true}}})");
  CHECK(pipelined.offload_optimizer.pipeline_read);
  CHECK_FALSE(pipelined.offload_optimizer.pin_memory);
  CHECK(parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
        "pin_memory": true}}})")
            .offload_optimizer.pin_memory);
  CHECK(parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true,
        "cpu_offload_use_pin_memory": true}})")
            .offload_optimizer.pin_memory);
  CHECK(pipelined.offload_optimizer.pipeline_write);
  CHECK(parse(R"({"zero_optimization": {"stage": 1, "cpu_offload": true}})")
            .offload_optimizer.device == OffloadOptimizerConfig::Device::cpu);
  CHECK_THROWS_WITH(
      parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})"),
      "[config] $.zero_optimization.offload_optimizer.nvme_path: expected the directory of the "
      "swap files with device \"nvme\", found none");
  CHECK_THROWS_WITH(
      parse(R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})"),
      "[config] $.zero_optimization.offload_optimizer: offloading the optimizer's state needs it "
      "partitioned; expected ZeRO stage 1-3, found stage 0");
  CHECK_THROWS_WITH(parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device":
        "nvme", "nvme_path": "/tmp", "ratio": 0.5}}})"),
                    "[config] $.zero_optimization.offload_optimizer.ratio: partial offload is not "
                    "implemented; expected 1.0, found 0.5");
  const ZeroConfig params = parse(R"({"zero_optimization": {"stage": 3, "offload_param":
        {"device": "nvme", "nvme_path": "/tmp/p", "buffer_count": 3, "buffer_size": 1e6}}})");
  CHECK(params.offload_param.device == OffloadParamConfig::Device::nvme);
  CHECK(params.offload_param.nvme_path == "/tmp/p");
  CHECK(params.offload_param.buffer_count == 3);
  CHECK(params.offload_param.buffer_size == 1'000'000);
  CHECK(parse(R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true}})")
            .offload_param.device == OffloadParamConfig::Device::cpu);
  CHECK_THROWS_WITH(
      parse(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"),
      "[config] $.zero_optimization.offload_param: offloading parameters needs them "
      "partitioned; expected ZeRO stage 3, found stage 2");
  CHECK_THROWS_WITH(
      parse(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"),
      "[config] $.zero_optimization.offload_param.nvme_path: expected the directory of the "
      "swap files with device \"nvme\", found none");
}

TEST_CASE("ZeRO-3 with its parameters on NVMe equals the in-memory run bitwise",
          "[zero][offload]") {
  const std::filesystem::path dir = testing::fresh_dir("zero_offload_params");
  for (const DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (const int world : {1, 3}) {
      for (const bool optimizer_too : {false, true}) {
        // f32 parameters' shard is the optimizer's master: it needs offload_optimizer.
        if (dtype == DType::f32 && !optimizer_too) continue;
        for (const bool overlap : {false, true}) {
          DYNAMIC_SECTION(dtype_name(dtype) << " world " << world << " offload_optimizer "
                                            << optimizer_too << " overlap_comm " << overlap) {
            ZeroConfig zero;
            zero.stage = 3;
            zero.overlap_comm = overlap;
            // Without overlap, the small parameters are persistent: gathered after the step
            // (from their swapped chunks, for f32).
            const int64_t persistent = overlap ? 0 : 64;
            zero.stage3_param_persistence_threshold = persistent;
            const std::vector<Run> memory = train(world, zero, dtype, RoundTrip::shard);
            zero.offload_param.device = OffloadParamConfig::Device::nvme;
            zero.offload_param.nvme_path = (dir / "params").string();
            zero.aio.block_size = 8192;
            if (optimizer_too) {
              zero.offload_optimizer.device = OffloadOptimizerConfig::Device::nvme;
              zero.offload_optimizer.nvme_path = (dir / "optimizer").string();
            }
            const std::vector<Run> nvme = train(world, zero, dtype, RoundTrip::shard);
            for (int r = 0; r < world; ++r) {
              INFO("rank " << r);
              CHECK(nvme[r].losses == memory[r].losses);
              CHECK(nvme[r].masters == memory[r].masters);
              CHECK(nvme[r].state == memory[r].state);
              CHECK(nvme[r].stepped == memory[r].stepped);
              check_streamed(nvme[r], memory[r], RoundTrip::shard, world);
              for (int s = 0; s < kSteps; ++s) {
                INFO("step " << s);
                // The 16-bit shard (2 bytes an element; f32: the f32 shard) left memory for
                // the swap file; with the optimizer's state and masters there too, nothing
                // of the parameters stays between steps but the persistent ones.
                const int64_t shard16 =
                    memory[r].param_bytes[s] - (optimizer_too ? 0 : nvme[r].param_bytes[s]);
                CHECK(shard16 > 0);
                CHECK(nvme[r].nvme_bytes[s] >= shard16);
                CHECK(nvme[r].param_bytes[s] < memory[r].param_bytes[s]);
                if (optimizer_too && persistent == 0) CHECK(nvme[r].param_bytes[s] == 0);
              }
            }
            // The files went with the runs (f32 keeps its shard in the optimizer's file).
            CHECK((!std::filesystem::exists(dir / "params") ||
                   std::filesystem::is_empty(dir / "params")));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::parallel
