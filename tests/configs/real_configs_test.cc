// DeepSpeed configs in the shape real ones have, each with its expected outcome from the
// expected.json beside it: it trains 2 steps on thread ranks, or it fails with exactly the
// message given. The files hold DeepSpeed's keys only, as real ones do; the test adds
// Tessera's model, data and trainer sections, and an entry's "tessera" object is merged
// over those (a client optimizer, Hugging Face's TrainingArguments' part), and its
// "filled" lines must be among the "auto" values the run reports.
//
// tests/configs/mixed_precision: fp16 and bf16 on the CPU (Hugging Face's ZeRO-2 fp16
// example with its "auto" values filled in, a Megatron-DeepSpeed bf16 ZeRO-1 file,
// DeepSpeedExamples' CIFAR fp16 with a static loss scale, bf16 ZeRO-3, bf16 with fp32
// gradient accumulation, fp16 ZeRO-2 with fp32 communication, bf16 ZeRO-2 asking for bf16
// accumulation, offload switched off, monitors and the profiler switched off, fp16's
// loss-scale keys copied under bf16).
// tests/configs/deepspeed: the other keys real files carry (Hugging Face's "auto"
// templates, Megatron files without an optimizer, DeepSpeed's pipeline and
// activation_checkpointing sections, the 1-bit optimizers' backend name, DeepSpeedExamples'
// BERT with gradient_predivide_factor, a file with four mistakes reported in one error).
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/json.h"
#include "tests/test_files.h"
#include "tests/tools/trainer/random_shard.h"
#include "tests/tools/trainer/thread_trainer.h"
#include "tools/trainer/checkpoint.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The sections a DeepSpeed file leaves to its framework: a small GPT-2, the random shard in
// `data`, 2 steps in `dir`.
Json tessera_sections(const fs::path& data, const fs::path& dir) {
  return {{"model",
           {{"type", "gpt2"},
            {"vocab_size", 29},
            {"block_size", 6},
            {"n_layer", 2},
            {"n_head", 2},
            {"n_embd", 16}}},
          {"data", {{"train", (data / "train_*.bin").string()}, {"sampling", "random"}}},
          {"trainer",
           {{"steps", 2},
            {"threads", 1},
            {"log_dir", dir.string()},
            {"checkpoint_dir", (dir / "ckpt").string()}}}};
}

// Runs every config of tests/configs/<folder> against its expected.json entry.
void check_folder(const std::string& folder) {
  const fs::path root = testing::fresh_dir(folder + "_configs");
  testing::write_random_shard(root / "data", 41);
  const fs::path configs = "tests/configs/" + folder;
  const Json expected = parse_json_file((configs / "expected.json").string());
  int files = 0;
  for (const auto& entry : fs::directory_iterator(configs)) {
    const std::string name = entry.path().filename().string();
    if (name == "expected.json") continue;
    ++files;
    INFO(name);
    REQUIRE(expected.contains(name));
    const Json& want = expected[name];
    Json doc = parse_json_file(entry.path().string());
    const fs::path dir = root / entry.path().stem();
    doc.merge_patch(tessera_sections(root / "data", dir));
    if (want.contains("tessera")) doc.merge_patch(want["tessera"]);
    const int world = want["world"].get<int>();
    if (want.contains("filled")) {
      const RunConfig c = parse_run_config(doc, name, dir.string(), world);
      for (const Json& line : want["filled"]) {
        INFO(line.get<std::string>());
        CHECK(std::count(c.auto_filled.begin(), c.auto_filled.end(), line.get<std::string>()) == 1);
      }
    }
    const std::string outcome = want["outcome"].get<std::string>();
    if (outcome == "runs") {
      testing::train_on_threads(doc, dir, world, ResumeMode::never);
      const std::optional<std::string> last = CheckpointDir((dir / "ckpt").string(), 0).latest();
      REQUIRE(last.has_value());
      CHECK(fs::path(*last).filename() == "step_00000002");
    } else {
      REQUIRE_THROWS_WITH(parse_run_config(doc, name, dir.string(), world), outcome);
    }
  }
  CHECK(files == static_cast<int>(expected.size()));
}

TEST_CASE("real-world-shaped fp16 and bf16 configs run on the CPU or fail as expected",
          "[config][mixed]") {
  check_folder("mixed_precision");
}

TEST_CASE("real-world-shaped DeepSpeed configs run or fail as expected", "[config]") {
  check_folder("deepspeed");
}

}  // namespace
}  // namespace tessera::train
