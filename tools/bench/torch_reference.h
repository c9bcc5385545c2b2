// The PyTorch reference of gpt2_step_bench as a coprocess (tools/bench/gpt2_step_torch.py
// --serve) that takes its timed steps when asked, so the bench interleaves them with its
// own: a drift in a shared host's speed then hits both frameworks alike.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace tessera::bench {

struct TorchReferenceOptions {
  std::string python;    // the interpreter with torch
  std::string script;    // gpt2_step_torch.py
  std::string blas_dir;  // put first on LD_LIBRARY_PATH when not empty
  int64_t batch = 4;
  int64_t seq = 64;
  int64_t warmup = 2;
  int threads = 2;
  std::string dtype = "f32";  // or "bf16": the script's CPU autocast
};

class TorchReference {
 public:
  // Starts the script (OPENBLAS_CORETYPE=SKYLAKEX, OMP_NUM_THREADS=threads) and waits for
  // it to build its model and take its warm-up steps. On failure ok() is false and why()
  // says what happened; the bench then runs without the reference.
  explicit TorchReference(const TorchReferenceOptions& options);
  ~TorchReference();
  TorchReference(const TorchReference&) = delete;
  TorchReference& operator=(const TorchReference&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  // The TORCH_READY object: torch version, threads, the BLAS it loaded, parameters.
  const nlohmann::json& meta() const { return meta_; }

  // Takes n timed steps; the TORCH_STEPS object (per-step seconds under "step_s",
  // "forward_s", "backward_s", "optimizer_s"), or nullopt once anything failed.
  std::optional<nlohmann::json> steps(int64_t n);
  // Ends the session: the TORCH_RESULT object over every step taken (medians, peak RSS).
  std::optional<nlohmann::json> finish();

 private:
  // Reads lines until one starts with `tag`, keeping the others for error messages.
  std::optional<nlohmann::json> read_tagged(const std::string& tag);
  bool send(const std::string& line);
  void fail(const std::string& what);
  void close_session();

  pid_t pid_ = -1;
  int to_child_ = -1;
  FILE* from_child_ = nullptr;
  std::string output_;  // lines that were not results, for error messages
  std::string why_;
  nlohmann::json meta_;
};

}  // namespace tessera::bench
