// The CUDA configs in configs/ (trainer.device "cuda"), which the GPU kit trains
// (tools/gpu/run.sh), run here as their CPU twins: the same file with the device set to
// "cpu" and the run cut to 20 steps, on as many thread ranks as its layout needs. So a CUDA
// config that stops parsing, or whose layout, precision or ZeRO stage stops training,
// fails on every machine, not only where a GPU is lent.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/json.h"
#include "tests/test_files.h"
#include "tests/tools/trainer/run_metrics.h"
#include "tests/tools/trainer/shakespeare_data.h"
#include "tests/tools/trainer/thread_trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The smallest world the config's pipeline and tensor slicing fit.
int min_world(const Json& doc) {
  return doc.value("pipeline", Json::object()).value("stages", 1) *
         doc.value("tensor_parallel", Json::object()).value("tp_size", 1);
}

TEST_CASE("every CUDA config trains as its CPU twin", "[config][trainer]") {
  std::vector<fs::path> cuda_configs;
  for (const auto& e : fs::directory_iterator("configs")) {
    if (e.path().extension() != ".json") continue;
    const Json doc = parse_json_file(e.path().string());
    if (doc.at("trainer").value("device", "cpu").rfind("cuda", 0) == 0) {
      cuda_configs.push_back(e.path());
    }
  }
  // shakespeare_char_cuda, its ZeRO-3 and its 3D variant.
  CHECK(cuda_configs.size() >= 3);
  const fs::path root = testing::fresh_dir("cuda_twins");
  for (const fs::path& path : cuda_configs) {
    DYNAMIC_SECTION(path.filename().string()) {
      Json doc = parse_json_file(path.string());
      const int world = min_world(doc);
      // What `train --check-config --world N` checks, on the file as shipped.
      const RunConfig shipped = load_run_config(path.string(), world);
      CHECK(shipped.trainer.device.is_cuda());
      CHECK(shipped.warnings.empty());

      const fs::path dir = root / path.stem();
      doc["data"] = testing::shakespeare_data_section();
      Json& t = doc["trainer"];
      t["device"] = "cpu";
      t["steps"] = 20;
      t["eval_interval"] = 10;
      t["eval_batches"] = 2;
      t["threads"] = 1;
      t["log_dir"] = dir.string();
      t["checkpoint_dir"] = (dir / "checkpoints").string();
      t["checkpoint_interval"] = 20;
      t.erase("sample");
      testing::train_on_threads(doc, dir, world, ResumeMode::never);
      const testing::RunMetrics m = testing::read_run_metrics(dir);
      REQUIRE(m.losses.size() == 20);
      REQUIRE(m.val_losses.size() == 2);
      // The warm-up's first 20 steps already lower the loss from ln 65 = 4.17.
      CHECK(m.losses.at(20) < 0.9 * m.losses.at(1));
      CHECK(m.val_losses.at(20) < m.val_losses.at(10));
      CHECK(fs::exists(dir / "checkpoints" / "step_00000020"));
    }
  }
}

}  // namespace
}  // namespace tessera::train
