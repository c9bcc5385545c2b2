#include "tools/trainer/metrics.h"

#include <filesystem>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/json.h"

namespace tessera::train {
namespace fs = std::filesystem;
namespace {

// The lines of `path` up to and including those of step `last_step` (jsonl: by the "step"
// field; csv: by the second column), keeping the CSV header.
std::vector<std::string> kept_lines(const fs::path& path, int64_t last_step, bool csv) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  std::string line;
  bool header = csv;
  while (std::getline(in, line)) {
    if (header) {
      header = false;
      continue;
    }
    int64_t step = -1;
    if (csv) {
      const size_t a = line.find(',');
      const size_t b = line.find(',', a + 1);
      if (a != std::string::npos && b != std::string::npos) {
        step = std::stoll(line.substr(a + 1, b - a - 1));
      }
    } else {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) {
        step = j["step"].get<int64_t>();
      }
    }
    if (step >= 0 && step <= last_step) kept.push_back(line);
  }
  return kept;
}

std::string csv_header() {
  std::string h;
  for (const std::string& c : MetricsLog::columns()) h += (h.empty() ? "" : ",") + c;
  return h;
}

}  // namespace

const std::vector<std::string>& MetricsLog::columns() {
  static const std::vector<std::string> kColumns = {
      "kind", "step", "loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "elapsed_s"};
  return kColumns;
}

MetricsLog::MetricsLog(const std::string& dir, int64_t resume_step) {
  fs::create_directories(dir);
  const fs::path jsonl = fs::path(dir) / "metrics.jsonl";
  const fs::path csv = fs::path(dir) / "metrics.csv";
  std::vector<std::string> old_jsonl, old_csv;
  if (resume_step >= 0) {
    old_jsonl = kept_lines(jsonl, resume_step, false);
    old_csv = kept_lines(csv, resume_step, true);
  }
  jsonl_.open(jsonl, std::ios::trunc);
  csv_.open(csv, std::ios::trunc);
  TS_CHECK(jsonl_ && csv_, "[metrics] cannot write ", jsonl.string(), " and ", csv.string());
  for (const std::string& l : old_jsonl) jsonl_ << l << '\n';
  csv_ << csv_header() << '\n';
  for (const std::string& l : old_csv) csv_ << l << '\n';
  jsonl_.flush();
  csv_.flush();
}

void MetricsLog::write(const nlohmann::json& record) {
  jsonl_ << record.dump() << '\n';
  std::string row;
  for (size_t i = 0; i < columns().size(); ++i) {
    if (i > 0) row += ',';
    const auto it = record.find(columns()[i]);
    if (it == record.end()) continue;
    row += it->is_string() ? it->get<std::string>() : it->dump();
  }
  csv_ << row << '\n';
  jsonl_.flush();
  csv_.flush();
}

}  // namespace tessera::train
