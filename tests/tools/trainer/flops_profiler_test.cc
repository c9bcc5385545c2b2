// The flops profiler (Note [Flops profiler] in tools/trainer/flops_profiler.h): DeepSpeed's
// counting rules on ops as they run (values worked by hand from the rules), DeepSpeed's
// number formatting, a GPT forward's MACs against the hand count of its products, and the
// report a training run writes at its profile step.
#include "tools/trainer/flops_profiler.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "models/layers/linear.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

Tensor leaf(const Shape& shape) {
  Tensor t = ones(shape);
  t.set_requires_grad(true);
  return t;
}

// A module whose forward runs one op of each counted kind under its own scope.
struct Ops : Module {
  Linear fc{4, 5};
  Ops() { register_module("fc", fc); }
  void forward() const {
    const ModuleScope scope(*this);
    fc(leaf({2, 3, 4}));                    // linear: 2 x 3 x 4 x 5 MACs
    matmul(leaf({2, 3, 4}), leaf({4, 6}));  // matmul: 24 x 6 MACs
    causal_attention(leaf({1, 2, 3, 4}), leaf({1, 2, 3, 4}), leaf({1, 2, 3, 4}));
    softmax(leaf({2, 7}));         // 14 FLOPs
    add(leaf({2, 7}), leaf({7}));  // 14 FLOPs
    exp(leaf({2, 7}));             // not counted
  }
};

TEST_CASE("ops are counted by DeepSpeed's rules and charged to their module", "[flops]") {
  Ops m;
  FlopsProfiler profiler(m);
  {
    const ForwardObserverGuard observing(profiler);
    m.forward();
    sum(leaf({3}));  // outside every module: not counted
  }
  const FlopsProfiler::Totals fc = profiler.totals(m.fc);
  CHECK(fc.macs == 120);
  CHECK(fc.flops == 240);  // the bias is not counted
  CHECK(fc.params == 25);
  const FlopsProfiler::Totals all = profiler.totals(m);
  // attention: numel(q) x Lk + numel(q) / D x Lk x Dv = 24 x 3 + 6 x 3 x 4
  CHECK(all.macs == 120 + 144 + 144);
  CHECK(all.flops == 2 * (120 + 144 + 144) + 14 + 14);
  CHECK(all.seconds >= fc.seconds);
}

TEST_CASE("numbers are written as DeepSpeed writes them", "[flops]") {
  CHECK(number_to_string(3.14159e12) == "3.14 T");
  CHECK(number_to_string(833.75e-6) == "833.75 u");
  CHECK(number_to_string(12) == "12 ");
  CHECK(number_to_string(0) == "0 ");
  CHECK(number_to_string(2.5e-3) == "2.5 m");
  CHECK(number_to_string(666.888e6) == "666.89 M");
}

TEST_CASE("a GPT forward's MACs are its products' hand count", "[flops]") {
  GptConfig c;
  c.vocab_size = 29;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  Gpt model(c, 3);
  FlopsProfiler profiler(model);
  const int64_t b = 3, t = 8, e = 16, vp = c.padded_vocab_size(), d = e / c.n_head;
  const Tensor idx = zeros({b, t}, {DType::i64});
  {
    const ForwardObserverGuard observing(profiler);
    model.forward(idx);
  }
  // Per block: q, k, v (3 e^2), attention (q k^T and p v: 2 x b h t t d), the output
  // projection (e^2) and the MLP (8 e^2), per token; then the tied head (e x vp).
  const double tokens = static_cast<double>(b * t);
  const double block = tokens * 12 * e * e + 2.0 * b * c.n_head * t * t * d;
  CHECK(profiler.totals(model).macs == c.n_layer * block + tokens * e * vp);
}

TEST_CASE("a run writes the report at its profile step", "[flops][trainer]") {
  const fs::path root = testing::fresh_dir("flops_profiler_run");
  testing::write_random_shard(root / "data", 41);
  const fs::path report = root / "profile" / "flops.txt";
  const nlohmann::json doc = testing::run_config(root / "data", root / "run", 0, 3, 1000,
                                                 {{"flops_profiler",
                                                   {{"enabled", true},
                                                    {"profile_step", 2},
                                                    {"top_modules", 2},
                                                    {"output_file", report.string()}}}});
  testing::train_on_threads(doc, root / "run", 1, ResumeMode::never);
  std::ifstream in(report);
  std::stringstream text;
  text << in.rdbuf();
  const std::string r = text.str();
  CHECK_THAT(r, Catch::Contains("Profile Summary at step 2:"));
  // The data-parallel run's micro-batch: 12 sequences in 2 micro-batches of 6.
  CHECK_THAT(r, Catch::Contains("batch size per GPU:"));
  CHECK_THAT(r, Catch::Contains("bwd latency:"));
  CHECK_THAT(r, Catch::Contains("depth 3:\n    params      - {'Block': "));
  CHECK_THAT(r, Catch::Contains("(h): ModuleList("));
  CHECK_THAT(testing::error_of([&] {
               nlohmann::json bad = doc;
               bad["flops_profiler"]["profile_steps"] = 2;
               parse_run_config(bad, "test", (root / "bad").string());
             }),
             Catch::Contains("unknown key $.flops_profiler.profile_steps"));
}

}  // namespace
}  // namespace tessera::train
