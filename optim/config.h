// The `optimizer` and `scheduler` sections of a DeepSpeed config.
#pragma once

#include <functional>
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

// `external`: a type registered by the caller of parse_optimizer (Note [External
// optimizers]).
enum class OptimizerType : uint8_t { adam, sgd, lamb, external };

// Note [External optimizers]
// Some optimizers need more than parameter groups to be built: the 1-bit family
// communicates over the data-parallel group, so parallel/compression defines, parses and
// builds it (parallel/compression/onebit_config.h), and optim/ knows nothing of it. Such a
// type reaches parse_optimizer as an ExternalOptimizerType: its DeepSpeed name and a parser
// for its params, which returns its own options and may fill the built-in options it shares
// (config.adam, config.lamb).
class ExternalOptimizer {
 public:
  virtual ~ExternalOptimizer() = default;
  // The type as DeepSpeed names it ("OneBitAdam").
  virtual std::string name() const = 0;
};

// `optimizer: {type, params, legacy_fusion}` with DeepSpeed's keys and defaults.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adam;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // type adam (AdamW unless adam_w_mode is false), adamw, and external types that share its
  // keys
  AdamOptions adam;
  SgdOptions sgd;
  LambOptions lamb;  // type lamb, and external types that share its keys
  std::shared_ptr<const ExternalOptimizer> external;  // type external
};

// An external optimizer type for parse_optimizer (Note [External optimizers]).
struct ExternalOptimizerType {
  std::string name;  // as DeepSpeed writes it; matched case-insensitively
  // Reads the type's params (lr and weight_decay are read into `config` already).
  std::function<std::shared_ptr<const ExternalOptimizer>(JsonObjectReader& params,
                                                         OptimizerConfig& config)>
      parse;
};

// Reads `section` ($.optimizer). Types are case-insensitive: Adam, AdamW, Lamb, SGD and the
// `external` ones; any other type names the supported ones. DeepSpeed's own errors are
// kept for `max_grad_norm` (use gradient_clipping) and amsgrad.
OptimizerConfig parse_optimizer(JsonObjectReader section,
                                const std::vector<ExternalOptimizerType>& external = {});
// Whether two optimizer type names name the same type (case-insensitively, as
// parse_optimizer reads them).
bool same_optimizer_type(const std::string& a, const std::string& b);
// The optimizer over `groups`; not for external types, which their own code builds.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config,
                                          std::vector<ParamGroup> groups);

// Adam's and LAMB's "betas": [beta1, beta2] in [0, 1), for external parsers too.
void read_betas(JsonObjectReader& params, double* beta1, double* beta2);
// LAMB's max_coeff and min_coeff (min <= max).
void read_lamb_coeffs(JsonObjectReader& params, LambOptions* lamb);

// Reads `section` ($.scheduler): {type, params} for WarmupLR, WarmupDecayLR, WarmupCosineLR,
// OneCycle or LRRangeTest with the keys and defaults of deepspeed/runtime/lr_schedules.py.
// WarmupCosineLR scales `base_lr` (the optimizer's lr).
std::unique_ptr<LrSchedule> parse_scheduler(JsonObjectReader section, double base_lr);

}  // namespace tessera::optim
