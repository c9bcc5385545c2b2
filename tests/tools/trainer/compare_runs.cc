// compare_runs A B TOL: compares two training run directories (log and checkpoints in
// A/log, A/ckpt as the mpirun tests lay them out): the training loss of every step in
// metrics.jsonl and every tensor of the latest checkpoint's model.safetensors. Each loss
// must agree within TOL relative, each tensor within TOL in relative L2 norm (TOL 0: bit
// for bit). A and B may instead both be .safetensors weight files (tools/zero_to_fp32's
// output): then only their tensors are compared. Prints the largest differences; exit code
// 0 when within TOL, 1 otherwise.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "models/io/safetensors.h"
#include "tools/trainer/checkpoint.h"

namespace {

std::map<int64_t, double> losses(const std::string& run) {
  std::map<int64_t, double> out;
  std::ifstream in(run + "/log/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r["kind"] == "train") out[r["step"].get<int64_t>()] = r["loss"].get<double>();
  }
  return out;
}

bool is_weights_file(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

std::map<std::string, std::vector<double>> weights(const std::string& run) {
  std::map<std::string, std::vector<double>> out;
  if (is_weights_file(run)) {
    for (const auto& [name, t] : tessera::read_safetensors(run).tensors) {
      out[name] = t.to_vector<double>();
    }
    return out;
  }
  const auto latest = tessera::train::CheckpointDir(run + "/ckpt", 0).latest();
  if (!latest) throw std::runtime_error("no checkpoint in " + run + "/ckpt");
  for (const auto& [name, t] : tessera::train::load_checkpoint(*latest, false).model) {
    out[name] = t.to_vector<double>();
  }
  return out;
}

int compare(const std::string& a, const std::string& b, double tol) {
  const bool files = is_weights_file(a) && is_weights_file(b);
  const auto la = files ? std::map<int64_t, double>() : losses(a);
  const auto lb = files ? std::map<int64_t, double>() : losses(b);
  if ((la.empty() && !files) || la.size() != lb.size()) {
    std::printf("compare_runs: %s has %zu training steps, %s has %zu\n", a.c_str(), la.size(),
                b.c_str(), lb.size());
    return 1;
  }
  double worst_loss = 0;
  for (const auto& [step, loss] : la) {
    if (lb.count(step) == 0) {
      std::printf("compare_runs: step %lld is missing from %s\n", static_cast<long long>(step),
                  b.c_str());
      return 1;
    }
    worst_loss = std::max(worst_loss, std::abs(loss - lb.at(step)) / std::abs(lb.at(step)));
  }
  const auto wa = weights(a), wb = weights(b);
  double worst_weight = 0;
  std::string worst_name;
  for (const auto& [name, va] : wa) {
    const auto it = wb.find(name);
    if (it == wb.end() || it->second.size() != va.size()) {
      std::printf("compare_runs: tensor %s differs in presence or size\n", name.c_str());
      return 1;
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      diff += (va[i] - it->second[i]) * (va[i] - it->second[i]);
      norm += it->second[i] * it->second[i];
    }
    const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    if (rel >= worst_weight) worst_weight = rel, worst_name = name;
  }
  const bool ok = worst_loss <= tol && worst_weight <= tol && wa.size() == wb.size();
  std::printf(
      "compare_runs: %s vs %s: %zu steps, largest loss difference %.3g, largest weight "
      "difference %.3g (%s); tolerance %.3g: %s\n",
      a.c_str(), b.c_str(), la.size(), worst_loss, worst_weight, worst_name.c_str(), tol,
      ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: compare_runs RUN_A RUN_B TOLERANCE\n");
    return 2;
  }
  try {
    return compare(argv[1], argv[2], std::stod(argv[3]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compare_runs: error: %s\n", e.what());
    return 1;
  }
}
