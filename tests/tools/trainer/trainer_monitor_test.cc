// DeepSpeed's monitors in a training run (Note [Monitor events] in tools/trainer/monitor.h):
// the TensorBoard events, decoded by an independent reader (read_tfevents.py), and the
// csv_monitor files carry DeepSpeed's tags at its sample counts with the values
// metrics.jsonl holds; fp16's loss scale only in fp16 runs; a resumed run keeps the rows up
// to its checkpoint and writes the rest once.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/test_files.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"
#include "tests/tools/trainer/tfevents_reader.h"
#include "tests/tools/trainer/thread_trainer.h"
#include "tools/trainer/csv_monitor.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// 6 ZeRO-1 steps on 2 thread ranks with both monitors, evaluating every 3 steps.
Json monitored_run(const fs::path& root, const fs::path& dir, const Json& precision) {
  Json extra = {{"wall_clock_breakdown", true},
                {"tensorboard", {{"enabled", true}, {"job_name", "tb"}}},
                {"csv_monitor", {{"enabled", true}, {"output_path", (dir / "csv").string()}}},
                {"data", {{"val", (root / "data" / "train_*.bin").string()}}},
                {"trainer", {{"eval_interval", 3}, {"eval_batches", 2}}}};
  extra.merge_patch(precision);
  return testing::run_config(root / "data", dir, 1, 6, 1000, extra);
}

// The metrics.jsonl records of `dir` by kind and step.
std::map<std::pair<std::string, int64_t>, Json> metrics(const fs::path& dir) {
  std::map<std::pair<std::string, int64_t>, Json> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json r = Json::parse(line);
    out[{r["kind"].get<std::string>(), r["step"].get<int64_t>()}] = r;
  }
  return out;
}

// The one event file under `folder`.
std::string event_file(const fs::path& folder) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(folder)) files.push_back(e.path().string());
  REQUIRE(files.size() == 1);
  return files[0];
}

// tag -> step -> value, from the decoded events.
std::map<std::string, std::map<int64_t, double>> by_tag(const std::vector<Json>& records) {
  std::map<std::string, std::map<int64_t, double>> out;
  for (const Json& r : records) {
    if (r.contains("tag")) out[r["tag"]][r["step"].get<int64_t>()] = r["simple_value"];
  }
  return out;
}

TEST_CASE("the monitors write DeepSpeed's tags at its sample counts", "[trainer][monitor]") {
  const fs::path root = testing::fresh_dir("trainer_monitor");
  testing::write_random_shard(root / "data", 41);
  const fs::path dir = root / "fp16";
  testing::train_on_threads(
      monitored_run(root, dir, {{"fp16", {{"enabled", true}, {"initial_scale_power", 12}}}}), dir,
      2, ResumeMode::never);
  const auto m = metrics(dir);
  const int64_t tbs = testing::kGlobalBatch;
  const std::vector<Json> records = testing::read_tfevents(event_file(dir / "tb"));
  REQUIRE(records.size() > 1);
  CHECK(records[0]["file_version"] == "brain.Event:2");
  const auto tags = by_tag(records);
  const auto f32 = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  for (int64_t step = 1; step <= 6; ++step) {
    INFO("step " << step);
    const Json& r = m.at({"train", step});
    // The loss at the count before the step, the rest after it.
    CHECK(tags.at("Train/Samples/train_loss").at((step - 1) * tbs) == f32(r["loss"]));
    const int64_t after = step * tbs;
    if (step < 6) {  // the next step's rate
      CHECK(tags.at("Train/Samples/lr").at(after) == f32(m.at({"train", step + 1})["lr"]));
    }
    CHECK(tags.at("Train/Samples/loss_scale").at(after) == 4096.0);
    CHECK(tags.at("Train/Samples/grad_norm").at(after) == f32(r["grad_norm"]));
    CHECK(tags.at("Train/Samples/tokens_per_s").at(after) == f32(r["tokens_per_s"]));
    CHECK(tags.at("Train/Samples/comm_bytes").at(after) == f32(r["comm_bytes"]));
    CHECK(tags.at("Train/Samples/mfu").at(after) == f32(r["mfu"]));
    CHECK(tags.at("Train/Samples/elapsed_time_ms_forward").at(after) == f32(r["forward_ms"]));
    CHECK(tags.at("Train/Samples/elapsed_time_ms_backward").at(after) > 0);
    CHECK(tags.at("Train/Samples/elapsed_time_ms_step").at(after) > 0);
  }
  CHECK(tags.at("Train/Samples/train_loss").size() == 6);
  CHECK(tags.at("Train/Samples/lr").size() == 6);
  for (const int64_t step : {3, 6}) {
    CHECK(tags.at("Train/Samples/eval_loss").at(step * tbs) ==
          f32(m.at({"eval", step})["val_loss"]));
  }
  CHECK(tags.at("Train/Samples/eval_loss").size() == 2);

  // csv_monitor: the same events, at double precision, one file per tag.
  const fs::path csv = dir / "csv" / "DeepSpeedJobName";
  std::string want = "step,train_loss\r\n";
  for (int64_t step = 1; step <= 6; ++step) {
    want += std::to_string((step - 1) * tbs) + "," +
            python_float_repr(m.at({"train", step})["loss"].get<double>()) + "\r\n";
  }
  CHECK(testing::read_bytes(csv / "Train_Samples_train_loss.csv") == want);
  CHECK(testing::read_bytes(csv / "Train_Samples_eval_loss.csv")
            .rfind("step,eval_loss\r\n" + std::to_string(3 * tbs) + ",", 0) == 0);
}

TEST_CASE("without fp16 there is no loss scale; a resumed run keeps rows up to its checkpoint",
          "[trainer][monitor]") {
  const fs::path root = testing::fresh_dir("trainer_monitor_resume");
  testing::write_random_shard(root / "data", 41);
  const fs::path dir = root / "run";
  Json doc = monitored_run(root, dir, Json::object());
  doc["trainer"]["steps"] = 3;
  testing::train_on_threads(doc, dir, 2, ResumeMode::never);
  const fs::path csv = dir / "csv" / "DeepSpeedJobName";
  CHECK_FALSE(fs::exists(csv / "Train_Samples_loss_scale.csv"));
  CHECK(by_tag(testing::read_tfevents(event_file(dir / "tb"))).count("Train/Samples/loss_scale") ==
        0);
  // Rows a killed run wrote after its last checkpoint (step 3) are dropped on resume.
  const int64_t tbs = testing::kGlobalBatch;
  {
    std::ofstream lr(csv / "Train_Samples_lr.csv", std::ios::app | std::ios::binary);
    lr << 5 * tbs << ",0.5\r\n";
  }
  doc["trainer"]["steps"] = 6;
  testing::train_on_threads(doc, dir, 2, ResumeMode::required);
  std::ifstream in(csv / "Train_Samples_lr.csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 7);
  CHECK(lines[0] == "step,lr\r");
  for (int64_t step = 1; step <= 6; ++step) {
    CHECK(lines[step].rfind(std::to_string(step * tbs) + ",", 0) == 0);
  }
  std::ifstream loss_in(csv / "Train_Samples_train_loss.csv");
  int loss_rows = -1;  // the header
  for (std::string line; std::getline(loss_in, line);) ++loss_rows;
  CHECK(loss_rows == 6);
  // The resumed run's events go to a file of their own, which starts by telling
  // TensorBoard to forget what it read past the checkpoint.
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "tb")) files.push_back(e.path().string());
  REQUIRE(files.size() == 2);
  std::sort(files.begin(), files.end());  // by the name's creation second, then number
  const std::vector<Json> resumed = testing::read_tfevents(files[1]);
  REQUIRE(resumed.size() > 2);
  CHECK(resumed[1]["session_log"] == "START");
  CHECK(resumed[1]["step"] == 3 * tbs + 1);
}

}  // namespace
}  // namespace tessera::train
