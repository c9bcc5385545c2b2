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

enum class OptimizerType : uint8_t { adam, sgd, lamb };

// `optimizer: {type, params, legacy_fusion}` with DeepSpeed's keys and defaults.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adam;
  double lr = 1e-3;
  double weight_decay = 0.0;
  AdamOptions adam;  // type adam (AdamW unless adam_w_mode is false) and adamw
  SgdOptions sgd;
  LambOptions lamb;
};

// Reads `section` ($.optimizer). Types are case-insensitive: Adam, AdamW, Lamb, SGD. The
// 1-bit family is refused until the compressed-communication backend exists; any other
// type names the supported ones. DeepSpeed's own errors are kept for `max_grad_norm`
// (use gradient_clipping) and amsgrad.
OptimizerConfig parse_optimizer(JsonObjectReader section);
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config,
                                          std::vector<ParamGroup> groups);

// Reads `section` ($.scheduler): {type, params} for WarmupLR, WarmupDecayLR, WarmupCosineLR,
// OneCycle or LRRangeTest with the keys and defaults of deepspeed/runtime/lr_schedules.py.
// WarmupCosineLR scales `base_lr` (the optimizer's lr).
std::unique_ptr<LrSchedule> parse_scheduler(JsonObjectReader section, double base_lr);

}  // namespace tessera::optim
