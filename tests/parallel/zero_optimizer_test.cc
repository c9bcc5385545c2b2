// ZeRO stages 0-3 on the thread backend against one process with the same global batch:
// 10 AdamW steps with gradient accumulation and active clipping on a GPT whose parameter
// count no world size divides. Losses, gradient norms and final parameters must agree
// within 1e-6 (relative), and all ranks must hold bitwise identical parameters.
#include "parallel/zero/zero_optimizer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mutex>

#include "autograd/engine.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "optim/clip.h"
#include "parallel/comm/thread_comm.h"
#include "tests/parallel/zero_test_gpt.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

constexpr int kSteps = 10;
constexpr int64_t kGlobalRows = 24;  // per step, over all ranks and micro-batches
constexpr int64_t kGas = 2;
constexpr int64_t kT = 6;
constexpr double kClip = 0.3;

GptConfig model_config() { return testing::zero_test_gpt(kT); }
optim::OptimizerConfig adamw() { return testing::zero_test_adamw(); }
// Token rows of every step: (kSteps * kGlobalRows, kT + 1), the same for every run.
Tensor all_rows() { return testing::zero_test_rows(kSteps * kGlobalRows, kT); }
std::pair<Tensor, Tensor> batch(const Tensor& rows, int64_t first, int64_t n) {
  return testing::zero_test_batch(rows, first, n);
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> params;
};

std::vector<std::vector<float>> snapshot(const Gpt& model) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : model.parameters()) out.push_back(p.detach().to_vector<float>());
  return out;
}

// The parameters in the model's order, from ZeroOptimizer::whole_parameters() (collective).
std::vector<std::vector<float>> snapshot(const Gpt& model, ZeroOptimizer& opt) {
  const StateDict whole = opt.whole_parameters();
  const std::map<std::string, Tensor> by_name(whole.begin(), whole.end());
  std::vector<std::vector<float>> out;
  for (const NamedParameter& p : model.named_parameters()) {
    out.push_back(by_name.at(p.name).to_vector<float>());
  }
  return out;
}

std::vector<optim::ParamGroup> groups_of(const Gpt& model) {
  return optim::decay_groups(model.named_parameters(), adamw().lr, adamw().weight_decay, true, {});
}

// One process, global batch per micro-batch.
Run reference(bool checkpointing = false) {
  const Tensor rows = all_rows();
  Gpt model(model_config(), 1234);
  model.set_activation_checkpointing(checkpointing);
  const auto opt = optim::make_optimizer(adamw(), groups_of(model));
  Run run;
  const int64_t micro = kGlobalRows / kGas;
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    double loss = 0;
    for (int64_t m = 0; m < kGas; ++m) {
      const auto [x, y] = batch(rows, s * kGlobalRows + m * micro, micro);
      const Tensor l = model.loss(model.forward(x), y);
      loss += l.item<double>() / kGas;
      backward(l, scalar_tensor(1.0 / kGas));
    }
    run.norms.push_back(optim::clip_grad_norm(model.parameters(), kClip));
    opt->step();
    run.losses.push_back(loss);
  }
  run.params = snapshot(model);
  return run;
}

// `world` thread ranks; rank r's micro-batch m is rows [m*micro*world + r*micro, +micro) of
// the step, the rows the DataLoader gives rank r.
std::vector<Run> data_parallel(int world, const ZeroConfig& zero, bool checkpointing = false,
                               const SimulatedLink& link = {}) {
  const Tensor rows = all_rows();
  std::vector<Run> runs(static_cast<size_t>(world));
  run_thread_ranks(world, [&](Communicator& comm) {
    comm.set_simulated_link(link);
    Gpt model(model_config(), 1234);
    model.set_activation_checkpointing(checkpointing);
    ZeroOptimizer opt(comm, model, groups_of(model), adamw(), zero);
    Run& run = runs[static_cast<size_t>(comm.rank())];
    const int64_t micro = kGlobalRows / kGas / world;
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      double loss = 0;
      for (int64_t m = 0; m < kGas; ++m) {
        const auto [x, y] = batch(rows, s * kGlobalRows + (m * world + comm.rank()) * micro, micro);
        const Tensor l = model.loss(model.forward(x), y);
        loss += l.item<double>() / kGas;
        opt.backward(l, 1.0 / kGas, m == kGas - 1);
      }
      const Tensor total = scalar_tensor(loss, {DType::f64});
      comm.all_reduce(total);
      run.losses.push_back(total.item<double>() / world);
      run.norms.push_back(opt.clip_grad_norm(kClip));
      opt.step();
    }
    run.params = snapshot(model, opt);
  });
  return runs;
}

void check_equivalent(const Run& want, const std::vector<Run>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    INFO("rank " << r);
    // Replicas are bitwise identical.
    REQUIRE(ranks[r].params == ranks[0].params);
    REQUIRE(ranks[r].norms == ranks[0].norms);
  }
  const Run& got = ranks[0];
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= 1e-6 * std::abs(want.losses[s]));
    CHECK(std::abs(got.norms[s] - want.norms[s]) <= 1e-6 * want.norms[s]);
    CHECK(want.norms[s] > kClip);  // clipping is active
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(testing::relative_l2_error(got.params[i], want.params[i]) <= 1e-6);
  }
}

TEST_CASE("the test model's parameter count is divisible by none of 2, 3, 4", "[zero]") {
  const int64_t n = model_config().num_parameters();
  CHECK(n % 2 != 0);
  CHECK(n % 3 != 0);
  CHECK(n == 18475);
}

TEST_CASE("ZeRO stages 0-2 at world sizes 1-4 equal the single-process run", "[zero]") {
  const Run want = reference();
  for (int stage = 0; stage <= 2; ++stage) {
    for (int world = 1; world <= 4; ++world) {
      // Small blocks: many reductions, chunks that cut through parameters.
      for (int64_t bucket : {int64_t{500'000'000}, int64_t{997}}) {
        DYNAMIC_SECTION("stage " << stage << ", world " << world << ", bucket " << bucket) {
          ZeroConfig zero;
          zero.stage = stage;
          zero.reduce_bucket_size = bucket;
          check_equivalent(want, data_parallel(world, zero));
        }
      }
    }
  }
}

// Stage 3 settings that make the partitioning do real work on the small model: every
// parameter above 30 elements partitioned (the LayerNorm weights, 25, stay whole), at most
// 6000 elements gathered (the largest parameter, wte, is 128 x 25 = 3200), prefetching a
// bucket of 2000 and no retention for reuse.
ZeroConfig stage3() {
  ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 30;
  z.stage3_max_live_parameters = 6000;
  z.stage3_prefetch_bucket_size = 2000;
  z.stage3_max_reuse_distance = 0;
  return z;
}

TEST_CASE("ZeRO stage 3 at world sizes 1-4 equals the single-process run", "[zero]") {
  const Run want = reference();
  for (int world = 1; world <= 4; ++world) {
    DYNAMIC_SECTION("world " << world) { check_equivalent(want, data_parallel(world, stage3())); }
  }
  SECTION("DeepSpeed's defaults: every parameter persistent at this size") {
    ZeroConfig zero;
    zero.stage = 3;
    check_equivalent(want, data_parallel(3, zero));
  }
  SECTION("coalesced reductions flushed in the middle of backward (Note [Coalesced reductions])") {
    ZeroConfig zero = stage3();
    zero.reduce_bucket_size = 997;
    check_equivalent(want, data_parallel(3, zero));
  }
  SECTION("no persistent parameters, retention for reuse, no prefetch") {
    ZeroConfig zero = stage3();
    zero.stage3_param_persistence_threshold = 0;
    zero.stage3_prefetch_bucket_size = 0;
    zero.stage3_max_reuse_distance = 1'000'000;
    check_equivalent(want, data_parallel(2, zero));
  }
}

TEST_CASE("ZeRO stage 3 with activation checkpointing equals the single-process run", "[zero]") {
  check_equivalent(reference(true), data_parallel(2, stage3(), true));
}

TEST_CASE("ZeRO stage 3 keeps gathered parameters within stage3_max_live_parameters", "[zero]") {
  // Per rank: peak gathered elements, live elements after backward and after the step, and
  // whether every persistent parameter stayed whole throughout.
  struct Seen {
    int64_t peak = 0, after_backward = -1, after_step = -1;
    bool persistent_whole = true;
    int64_t persistent = 0, partitioned = 0;
  };
  std::vector<Seen> seen(3);
  const Tensor rows = all_rows();
  run_thread_ranks(3, [&](Communicator& comm) {
    Gpt model(model_config(), 1234);
    ZeroOptimizer opt(comm, model, groups_of(model), adamw(), stage3());
    const PartitionedParams& parts = *opt.partitioned();
    Seen& s = seen[static_cast<size_t>(comm.rank())];
    const int64_t n = static_cast<int64_t>(opt.layout().params.size());
    auto check_persistent = [&] {
      for (int64_t i = 0; i < n; ++i) {
        if (parts.persistent(i) && !parts.gathered(i)) s.persistent_whole = false;
      }
    };
    for (int64_t i = 0; i < n; ++i) ++(parts.persistent(i) ? s.persistent : s.partitioned);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      const auto [x, y] = batch(rows, step * 6 + comm.rank() * 2, 2);
      const Tensor loss = model.loss(model.forward(x), y);
      check_persistent();
      opt.backward(loss, 1.0, true);
      s.after_backward = std::max(s.after_backward, parts.live_numel());
      check_persistent();
      opt.clip_grad_norm(1.0);
      opt.step();
      s.after_step = std::max(s.after_step, parts.live_numel());
      check_persistent();
    }
    s.peak = parts.peak_live_numel();
  });
  for (const Seen& s : seen) {
    CHECK(s.persistent == 5);  // ln_1, ln_2 of two blocks and ln_f
    CHECK(s.partitioned == 10);
    CHECK(s.peak > 3200);  // prefetching gathered beyond one parameter
    CHECK(s.peak <= 6000);
    CHECK(s.after_backward == 0);
    CHECK(s.after_step == 0);
    CHECK(s.persistent_whole);
  }
}

TEST_CASE("ZeRO stage 3 refuses a live bound below what one module call needs", "[zero]") {
  std::vector<std::string> errors(2);
  run_thread_ranks(2, [&](Communicator& comm) {
    Gpt model(model_config(), 1234);
    ZeroConfig zero = stage3();
    zero.stage3_max_live_parameters = 3000;
    ZeroOptimizer opt(comm, model, groups_of(model), adamw(), zero);
    try {
      model.forward(zeros({1, kT}, {DType::i32}));
    } catch (const Error& e) {
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) {
    CHECK(e ==
          "[zero] stage 3: a call of the module holding \"transformer.wte.weight\" needs 3200 "
          "more gathered parameter elements while 0 are held by calls in progress; expected "
          "stage3_max_live_parameters >= 3200, found 3000");
  }
}

TEST_CASE("a released ZeRO-3 parameter read outside a module call is an error", "[zero]") {
  run_thread_ranks(1, [&](Communicator& comm) {
    Gpt model(model_config(), 1234);
    ZeroOptimizer opt(comm, model, groups_of(model), adamw(), stage3());
    const Tensor w = model.named_parameters()[0].tensor;  // transformer.wte.weight
    CHECK_THROWS_WITH(w.to_vector<float>(), Catch::Contains("reads memory that has been released"));
    // Inside a gather (here: the whole model's) the values are there.
    StateDict whole = opt.whole_parameters();
    CHECK(whole[0].second.numel() == w.numel());
    // load_parameters takes exactly the trainable parameters.
    whole.emplace_back("extra", zeros({1}));
    CHECK_THROWS_WITH(opt.load_parameters(whole),
                      "[zero] unexpected tensor \"extra\"; expected only the model's trainable "
                      "parameters");
  });
}

TEST_CASE("overlap_comm and reduce_scatter=false give the same results", "[zero]") {
  const Run want = reference();
  for (int stage = 0; stage <= 2; ++stage) {
    DYNAMIC_SECTION("stage " << stage) {
      ZeroConfig zero;
      zero.stage = stage;
      zero.reduce_bucket_size = 2000;
      zero.overlap_comm = true;
      zero.reduce_scatter = false;
      check_equivalent(want, data_parallel(3, zero));
    }
  }
}

// Note [Overlapped reductions] in parallel/zero/gradient_reducer.h (and the gathers: Note
// [ZeRO-3 parameters]'s at stage 3, Note [Gathers after the step]'s at stages 1-2, these
// behind a slow link so that they are still travelling when the next forward starts):
// operations started on the worker while forward and backward compute give the bits of the
// blocking ones. A block reduced before its last gradient arrived, a shard read before its
// reduction finished, or a parameter read before its gather did, would change them.
TEST_CASE("overlapped reductions and gathers give the blocking run's bits", "[zero]") {
  const SimulatedLink slow{.gbit_per_s = 1.0, .latency_us = 50};
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {2, 4}) {
      DYNAMIC_SECTION("stage " << stage << ", world " << world) {
        ZeroConfig zero;
        zero.stage = stage;
        zero.reduce_bucket_size = 2000;               // many blocks, several in flight
        zero.stage3_param_persistence_threshold = 0;  // every parameter gathered when used
        zero.stage3_prefetch_bucket_size = 5000;
        const SimulatedLink link = stage == 1 || stage == 2 ? slow : SimulatedLink{};
        zero.overlap_comm = false;
        const std::vector<Run> blocking = data_parallel(world, zero, false, link);
        zero.overlap_comm = true;
        const std::vector<Run> overlapped = data_parallel(world, zero, false, link);
        for (int r = 0; r < world; ++r) {
          INFO("rank " << r);
          CHECK(overlapped[r].losses == blocking[r].losses);
          CHECK(overlapped[r].norms == blocking[r].norms);
          CHECK(overlapped[r].params == blocking[r].params);
        }
      }
    }
  }
}

// Note [Coalesced reductions] and Note [Overlapped reductions] at stage 3: one-parameter
// blocks are reduce-scattered a bucket at a time, not one collective each, and the
// reductions in flight hold at most two buckets' elements (or two of the largest block):
// behind a slow link, two travel while backward goes on.
TEST_CASE("stage 3 coalesces its reductions and bounds those in flight", "[zero]") {
  const SimulatedLink slow{.gbit_per_s = 0.2, .latency_us = 50};
  constexpr int64_t kBucket = 1000;
  std::vector<GradientReducer::InFlightPeak> peaks(2);
  std::vector<int64_t> reductions(2);
  int64_t blocks = 0;
  int64_t largest_block = 0;
  run_thread_ranks(2, [&](Communicator& comm) {
    comm.set_simulated_link(slow);
    Gpt model(model_config(), 1);
    ZeroConfig zero = stage3();
    zero.reduce_bucket_size = kBucket;
    zero.overlap_comm = true;
    ZeroOptimizer opt(comm, model, groups_of(model), adamw(), zero);
    opt.zero_grad();
    const auto [x, y] = batch(all_rows(), comm.rank() * 2, 2);
    const int64_t before = comm.stats()[CommOp::reduce_scatter].calls;
    opt.backward(model.loss(model.forward(x), y), 1.0, true);
    reductions[static_cast<size_t>(comm.rank())] =
        comm.stats()[CommOp::reduce_scatter].calls - before;
    opt.step();
    opt.wait_for_parameters();
    peaks[static_cast<size_t>(comm.rank())] = opt.peak_reductions_in_flight();
    if (comm.rank() == 0) {
      blocks = static_cast<int64_t>(opt.layout().blocks.size());
      for (const FlatLayout::Block& b : opt.layout().blocks) {
        largest_block = std::max(largest_block, b.numel);
      }
    }
  });
  const int64_t numel = model_config().num_parameters();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << reductions[r] << " reduce-scatters of " << blocks
                 << " blocks; peak " << peaks[r].reductions << " reductions, " << peaks[r].numel
                 << " elements");
    // Block by block would be one each; the blocks under the bucket's size share some.
    CHECK(reductions[r] < blocks);
    CHECK(reductions[r] <= numel / kBucket + 1);
    CHECK(peaks[r].numel <= 2 * std::max(kBucket, largest_block));
    CHECK(peaks[r].reductions == 2);  // behind the slow link, the next bucket waits
  }
}

// Stage 3 with gathers in flight (a slow link) through everything that moves them:
// prefetches released by stage3_max_live_parameters before use, the recomputation of
// activation checkpointing, and persistent parameters beside gathered ones.
TEST_CASE("overlapped stage 3 gathers give the blocking run's bits at tight limits", "[zero]") {
  const SimulatedLink slow{.gbit_per_s = 1.0, .latency_us = 50};
  for (const bool checkpointing : {false, true}) {
    DYNAMIC_SECTION("checkpointing " << checkpointing) {
      ZeroConfig zero = stage3();  // max_live 6000, prefetch 2000
      zero.stage3_param_persistence_threshold = 64;
      zero.overlap_comm = false;
      const std::vector<Run> blocking = data_parallel(2, zero, checkpointing, slow);
      zero.overlap_comm = true;
      const std::vector<Run> overlapped = data_parallel(2, zero, checkpointing, slow);
      for (int r = 0; r < 2; ++r) {
        INFO("rank " << r);
        CHECK(overlapped[r].losses == blocking[r].losses);
        CHECK(overlapped[r].norms == blocking[r].norms);
        CHECK(overlapped[r].params == blocking[r].params);
      }
    }
  }
}

TEST_CASE("ZeRO shards optimizer state, gradients and parameters by 1/world", "[zero]") {
  for (int stage = 0; stage <= 3; ++stage) {
    DYNAMIC_SECTION("stage " << stage) {
      std::vector<ModelStateBytes> bytes(4);
      run_thread_ranks(4, [&](Communicator& comm) {
        Gpt model(model_config(), 1);
        ZeroConfig zero;
        zero.stage = stage;
        zero.stage3_param_persistence_threshold = 0;
        ZeroOptimizer opt(comm, model, groups_of(model), adamw(), zero);
        opt.zero_grad();
        const Tensor x = zeros({1, kT}, {DType::i32});
        opt.backward(model.loss(model.forward(x), x), 1.0, true);
        opt.clip_grad_norm(0);
        opt.step();
        bytes[static_cast<size_t>(comm.rank())] = opt.model_state_bytes();
      });
      const double p = 4.0 * static_cast<double>(model_config().num_parameters());
      const ModelStateBytes& b = bytes[0];
      // Padding adds at most world - 1 elements per block (two blocks; stage 3: one per
      // parameter, 15).
      const double pad = 3.0 * (stage == 3 ? 15 : 2);
      CHECK(b.params == Approx(stage == 3 ? p / 4 : p).margin(4 * pad));
      CHECK(b.grads == Approx(stage >= 2 ? p / 4 : p).margin(4 * pad));
      CHECK(b.optimizer == Approx(stage == 0 ? 2 * p : 2 * p / 4).margin(8 * pad));
    }
  }
}

TEST_CASE("whole_state reassembles the shards; load_whole_state reshards them", "[zero]") {
  // Train 3 steps at world 2, stage 2; move the state to world 3, stage 1, and to stage 0.
  std::vector<StateDict> shards(2);
  FlatLayout layout2;
  const Tensor rows = all_rows();
  run_thread_ranks(2, [&](Communicator& comm) {
    Gpt model(model_config(), 5);
    ZeroConfig zero;
    zero.stage = 2;
    zero.reduce_bucket_size = 700;
    ZeroOptimizer opt(comm, model, groups_of(model), adamw(), zero);
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      const auto [x, y] = batch(rows, s * 4 + comm.rank() * 2, 2);
      opt.backward(model.loss(model.forward(x), y), 1.0, true);
      opt.clip_grad_norm(0);
      opt.step();
    }
    StateDict own;
    for (const auto& [k, t] : opt.state_dict()) own.emplace_back(k, t.clone());
    shards[static_cast<size_t>(comm.rank())] = own;
    if (comm.rank() == 0) layout2 = opt.layout();
  });
  const StateDict whole = whole_state(layout2, shards);
  REQUIRE(whole.size() == 1 + 2 * layout2.params.size());
  CHECK(whole[0].first == "step");
  CHECK(whole[0].second.item<int64_t>() == 3);

  for (int stage : {0, 1}) {
    const int world = stage == 0 ? 1 : 3;
    std::vector<StateDict> again(static_cast<size_t>(world));
    FlatLayout layout;
    run_thread_ranks(world, [&](Communicator& comm) {
      Gpt model(model_config(), 5);
      ZeroConfig zero;
      zero.stage = stage;
      ZeroOptimizer opt(comm, model, groups_of(model), adamw(), zero);
      opt.load_whole_state(whole);
      CHECK(opt.step_count() == 3);
      StateDict own;
      for (const auto& [k, t] : opt.state_dict()) own.emplace_back(k, t.clone());
      again[static_cast<size_t>(comm.rank())] = own;
      if (comm.rank() == 0) layout = opt.layout();
    });
    const StateDict back = stage == 0 ? again[0] : whole_state(layout, again);
    REQUIRE(back.size() == whole.size());
    std::map<std::string, Tensor> by_name(back.begin(), back.end());
    for (const auto& [k, t] : whole) {
      INFO(k);
      REQUIRE(by_name.count(k) == 1);
      CHECK(by_name[k].to_vector<double>() == t.to_vector<double>());
    }
  }
}

}  // namespace
}  // namespace tessera::parallel
