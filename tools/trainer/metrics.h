// Training metrics on disk: one JSON object per line (metrics.jsonl) and the same records
// as CSV (metrics.csv), flushed after every record so that a killed run keeps its log.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::train {

class MetricsLog {
 public:
  // The CSV columns, in order; a record's missing fields are left empty.
  static const std::vector<std::string>& columns();

  // Opens `dir`/metrics.{jsonl,csv}. A fresh run (resume_step < 0) starts them empty; a
  // resumed run keeps the records up to `resume_step` and drops later ones, which a run
  // that was killed after its last checkpoint wrote and the resumed run writes again.
  MetricsLog(const std::string& dir, int64_t resume_step);

  // Appends `record`: {"kind": "train" | "eval", "step": n, ...columns()}.
  void write(const nlohmann::json& record);

 private:
  std::ofstream jsonl_;
  std::ofstream csv_;
};

}  // namespace tessera::train
