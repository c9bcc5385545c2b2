// The `optimizer` and `scheduler` sections of a DeepSpeed config.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "optim/adam.h"
#include "optim/lamb.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace tessera::optim {

enum class OptimizerType : uint8_t { adam, sgd, lamb, onebit_adam, zero_one_adam, onebit_lamb };

// Whether `type` is one of the communication-compressed optimizers, which
// parallel::ZeroOptimizer builds over its data-parallel group (make_optimizer() cannot).
bool is_onebit(OptimizerType type);

// The 1-bit family's own keys ($.optimizer.params of OneBitAdam, ZeroOneAdam, OneBitLamb),
// with DeepSpeed's defaults (deepspeed/runtime/fp16/onebit/{adam,zoadam,lamb}.py). Their
// betas, eps and weight_decay go to `adam` (OneBitAdam, ZeroOneAdam) or `lamb` (OneBitLamb,
// with max_coeff and min_coeff).
struct OneBitOptions {
  int64_t freeze_step = 100000;       // OneBitAdam, OneBitLamb: last full-precision step
  int64_t var_freeze_step = 100000;   // ZeroOneAdam: last step that updates the variance
  int64_t var_update_scaler = 16;     // ZeroOneAdam: variance steps per interval doubling
  int64_t local_step_scaler = 32678;  // ZeroOneAdam: local steps per interval doubling
  int64_t local_step_clipper = 16;    // ZeroOneAdam: the largest sync interval
  double coeff_beta = 0.9;            // OneBitLamb: EMA of the warm-up trust ratios
  double factor_max = 4.0;            // OneBitLamb: bounds of the compressed-stage factor
  double factor_min = 0.5;
  double factor_threshold = 0.1;  // OneBitLamb: the factor's largest change per step
  // DeepSpeed's backend choice ("nccl", "mpi" or "compressed"). Tessera compresses over
  // the run's own data-parallel communicator whatever the name; it is validated and logged.
  std::string comm_backend_name = "nccl";
};

// `optimizer: {type, params, legacy_fusion}` with DeepSpeed's keys and defaults.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adam;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // type adam (AdamW unless adam_w_mode is false), adamw, onebitadam and zerooneadam
  AdamOptions adam;
  SgdOptions sgd;
  LambOptions lamb;  // type lamb and onebitlamb
  OneBitOptions onebit;
};

// Reads `section` ($.optimizer). Types are case-insensitive: Adam, AdamW, Lamb, SGD,
// OneBitAdam, ZeroOneAdam, OneBitLamb; any other type names the supported ones.
// DeepSpeed's own errors are kept for `max_grad_norm` (use gradient_clipping) and amsgrad.
// The 1-bit family applies no bias correction (DeepSpeed's semantics), so an explicit
// "bias_correction": true is refused rather than silently ignored as DeepSpeed does.
OptimizerConfig parse_optimizer(JsonObjectReader section);
// The optimizer over `groups`; not for the 1-bit family (is_onebit), which needs a
// data-parallel group (parallel/compression/onebit_optimizer.h).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config,
                                          std::vector<ParamGroup> groups);

// Reads `section` ($.scheduler): {type, params} for WarmupLR, WarmupDecayLR, WarmupCosineLR,
// OneCycle or LRRangeTest with the keys and defaults of deepspeed/runtime/lr_schedules.py.
// WarmupCosineLR scales `base_lr` (the optimizer's lr).
std::unique_ptr<LrSchedule> parse_scheduler(JsonObjectReader section, double base_lr);

}  // namespace tessera::optim
