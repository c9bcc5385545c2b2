// The 1-bit optimizers' section of a run config: their types for optim::parse_optimizer
// (Note [External optimizers] in optim/config.h), their own keys and DeepSpeed's defaults
// (deepspeed/runtime/fp16/onebit/{adam,zoadam,lamb}.py).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optim/config.h"

namespace tessera::parallel {

// 1-bit Adam, 0/1 Adam, 1-bit LAMB.
enum class OneBitKind : uint8_t { adam, zero_one_adam, lamb };

// The 1-bit family's own keys ($.optimizer.params of OneBitAdam, ZeroOneAdam, OneBitLamb).
// Their betas, eps and weight_decay go to the config's `adam` (OneBitAdam, ZeroOneAdam) or
// `lamb` (OneBitLamb, with max_coeff and min_coeff), without bias correction. DeepSpeed's
// backend choice comm_backend_name ("nccl", "mpi" or "compressed") is kept for
// check_comm_backend.
struct OneBitOptions {
  int64_t freeze_step = 100000;       // OneBitAdam, OneBitLamb: last full-precision step
  int64_t var_freeze_step = 100000;   // ZeroOneAdam: last step that updates the variance
  int64_t var_update_scaler = 16;     // ZeroOneAdam: variance steps per interval doubling
  int64_t local_step_scaler = 32678;  // ZeroOneAdam: local steps per interval doubling
  int64_t local_step_clipper = 16;    // ZeroOneAdam: the largest sync interval
  double coeff_beta = 0.9;            // OneBitLamb: EMA of the warm-up trust ratios
  double factor_max = 4.0;            // OneBitLamb: bounds of the compressed-stage factor
  double factor_min = 0.5;
  double factor_threshold = 0.1;            // OneBitLamb: the factor's largest change per step
  std::optional<std::string> comm_backend;  // comm_backend_name, when given
  std::string comm_backend_path;            // its JSON path, for check_comm_backend's errors
};

// An optimizer config's 1-bit part (OptimizerConfig::external).
class OneBitConfig final : public optim::ExternalOptimizer {
 public:
  OneBitConfig(OneBitKind kind, OneBitOptions options) : kind(kind), options(std::move(options)) {}
  // "OneBitAdam", "ZeroOneAdam" or "OneBitLamb".
  std::string name() const override;
  // DeepSpeed's name in its messages: "1bit-Adam", "0/1 Adam", "1bit-Lamb".
  std::string display_name() const;

  OneBitKind kind;        // which of the three
  OneBitOptions options;  // its own keys
};

// OneBitAdam, ZeroOneAdam and OneBitLamb, for optim::parse_optimizer. An explicit
// "bias_correction": true is refused (they apply none, DeepSpeed's semantics) rather than
// silently ignored as DeepSpeed does.
const std::vector<optim::ExternalOptimizerType>& onebit_optimizer_types();

// Checks the 1-bit optimizer's comm_backend_name against the backend the run's
// data-parallel group has: "nccl" needs a CUDA run (whose ranks reduce over NCCL), "mpi" a
// CPU run (MPI across processes, or threads in one); "compressed" (DeepSpeed's backend
// that builds the compressed all-reduce from all_to_all and all_gather, as Tessera does on
// every backend) fits both. Nothing to check without the key or a 1-bit optimizer.
void check_comm_backend(const optim::OptimizerConfig& config, bool cuda_run);

// The 1-bit part of `config`, or null when it names another optimizer.
const OneBitConfig* onebit_config(const optim::OptimizerConfig& config);

// A config for the 1-bit optimizer `kind` with `options` and `base`'s lr, weight decay and
// Adam or LAMB options (bias correction off), as parsing one would make it.
optim::OptimizerConfig make_onebit_config(OneBitKind kind, const OneBitOptions& options,
                                          optim::OptimizerConfig base = {});

}  // namespace tessera::parallel
