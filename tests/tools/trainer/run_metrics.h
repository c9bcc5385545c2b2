// A training run's losses as its metrics.jsonl recorded them, for the trainer tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::testing {

struct RunMetrics {
  std::map<int64_t, double> losses;      // step -> training loss
  std::map<int64_t, double> val_losses;  // step -> validation loss
};

// Reads `dir`/metrics.jsonl (absent: no records).
inline RunMetrics read_run_metrics(const std::filesystem::path& dir) {
  RunMetrics m;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    const int64_t step = r["step"].get<int64_t>();
    if (r["kind"] == "train") m.losses[step] = r["loss"].get<double>();
    if (r["kind"] == "eval") m.val_losses[step] = r["val_loss"].get<double>();
  }
  return m;
}

}  // namespace tessera::testing
