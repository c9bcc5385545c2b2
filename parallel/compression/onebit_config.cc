#include "parallel/compression/onebit_config.h"

#include <limits>
#include <memory>
#include <string>

#include "core/error.h"

namespace tessera::parallel {
namespace {

// The keys OneBitAdam, ZeroOneAdam and OneBitLamb share.
void read_common(JsonObjectReader& params, double* beta1, double* beta2, double* eps,
                 OneBitOptions* o) {
  optim::read_betas(params, beta1, beta2);
  *eps = params.get_in_range<double>("eps", *eps, 0.0, 1.0);
  // DeepSpeed parses both and uses neither; a value that would not take effect is an error.
  if (params.get<bool>("bias_correction", false)) {
    params.unsupported("bias_correction",
                       "the 1-bit optimizers apply no bias correction (DeepSpeed's semantics); "
                       "expected false or absent");
  }
  if (params.get<bool>("eps_inside_sqrt", false)) {
    params.unsupported("eps_inside_sqrt",
                       "the 1-bit optimizers add eps outside the square root; expected false or "
                       "absent");
  }
  params.ignored("cuda_aware", "Tessera's communicators move device buffers directly");
  if (params.has("comm_backend_name")) {
    o->comm_backend = params.get_one_of("comm_backend_name", "nccl", {"nccl", "mpi", "compressed"});
    o->comm_backend_path = params.key_path("comm_backend_name");
  }
}

int64_t read_step(JsonObjectReader& params, const char* key, int64_t fallback, int64_t min) {
  return params.get_in_range<int64_t>(key, fallback, min, std::numeric_limits<int64_t>::max());
}

std::shared_ptr<const optim::ExternalOptimizer> parse_adam_family(JsonObjectReader& params,
                                                                  optim::OptimizerConfig& c,
                                                                  OneBitKind kind) {
  OneBitOptions o;
  read_common(params, &c.adam.beta1, &c.adam.beta2, &c.adam.eps, &o);
  c.adam.bias_correction = false;
  if (kind == OneBitKind::adam) {
    // Step 1 is the initialization step: at least one full-precision step must follow it,
    // or the frozen variance would be zero.
    o.freeze_step = read_step(params, "freeze_step", o.freeze_step, 2);
  } else {
    o.var_freeze_step = read_step(params, "var_freeze_step", o.var_freeze_step, 2);
    o.var_update_scaler = read_step(params, "var_update_scaler", o.var_update_scaler, 1);
    o.local_step_scaler = read_step(params, "local_step_scaler", o.local_step_scaler, 1);
    o.local_step_clipper = read_step(params, "local_step_clipper", o.local_step_clipper, 1);
  }
  return std::make_shared<OneBitConfig>(kind, o);
}

std::shared_ptr<const optim::ExternalOptimizer> parse_lamb(JsonObjectReader& params,
                                                           optim::OptimizerConfig& c) {
  OneBitOptions o;
  read_common(params, &c.lamb.beta1, &c.lamb.beta2, &c.lamb.eps, &o);
  c.lamb.bias_correction = false;
  optim::read_lamb_coeffs(params, &c.lamb);
  o.freeze_step = read_step(params, "freeze_step", o.freeze_step, 2);
  o.coeff_beta = params.get_in_range<double>("coeff_beta", o.coeff_beta, 0.0, 0.999999);
  o.factor_max = params.get_in_range<double>("factor_max", o.factor_max, 1e-9, 1e9);
  o.factor_min = params.get_in_range<double>("factor_min", o.factor_min, 1e-9, 1e9);
  TS_CHECK(o.factor_min <= o.factor_max, "[config] ", params.key_path("factor_min"),
           ": expected factor_min <= factor_max (", o.factor_max, "), found ", o.factor_min);
  o.factor_threshold =
      params.get_in_range<double>("factor_threshold", o.factor_threshold, 0.0, 1.0);
  return std::make_shared<OneBitConfig>(OneBitKind::lamb, o);
}

}  // namespace

std::string OneBitConfig::name() const {
  switch (kind) {
    case OneBitKind::adam:
      return "OneBitAdam";
    case OneBitKind::zero_one_adam:
      return "ZeroOneAdam";
    case OneBitKind::lamb:
      return "OneBitLamb";
  }
  TS_INTERNAL_ASSERT(false, "unhandled 1-bit optimizer kind");
  return "";
}

std::string OneBitConfig::display_name() const {
  switch (kind) {
    case OneBitKind::adam:
      return "1bit-Adam";
    case OneBitKind::zero_one_adam:
      return "0/1 Adam";
    case OneBitKind::lamb:
      return "1bit-Lamb";
  }
  TS_INTERNAL_ASSERT(false, "unhandled 1-bit optimizer kind");
  return "";
}

const std::vector<optim::ExternalOptimizerType>& onebit_optimizer_types() {
  static const std::vector<optim::ExternalOptimizerType> types = {
      {"OneBitAdam",
       [](JsonObjectReader& p, optim::OptimizerConfig& c) {
         return parse_adam_family(p, c, OneBitKind::adam);
       }},
      {"ZeroOneAdam",
       [](JsonObjectReader& p, optim::OptimizerConfig& c) {
         return parse_adam_family(p, c, OneBitKind::zero_one_adam);
       }},
      {"OneBitLamb", &parse_lamb},
  };
  return types;
}

const OneBitConfig* onebit_config(const optim::OptimizerConfig& config) {
  return dynamic_cast<const OneBitConfig*>(config.external.get());
}

optim::OptimizerConfig make_onebit_config(OneBitKind kind, const OneBitOptions& options,
                                          optim::OptimizerConfig base) {
  base.type = optim::OptimizerType::external;
  base.adam.bias_correction = false;
  base.lamb.bias_correction = false;
  base.external = std::make_shared<OneBitConfig>(kind, options);
  return base;
}

void check_comm_backend(const optim::OptimizerConfig& config, bool cuda_run) {
  const OneBitConfig* onebit = onebit_config(config);
  if (onebit == nullptr || !onebit->options.comm_backend) return;
  const std::string& backend = *onebit->options.comm_backend;
  if (backend == "compressed") return;
  const std::string key = "[config] " + onebit->options.comm_backend_path + ": \"";
  TS_CHECK(backend != "nccl" || cuda_run, key, backend,
           "\" compresses over NCCL, which Tessera's data-parallel ranks use on CUDA devices; "
           "expected \"mpi\" or \"compressed\" for this CPU run, or trainer.device \"cuda\"");
  TS_CHECK(backend != "mpi" || !cuda_run, key, backend,
           "\" compresses over MPI, and this CUDA run's ranks reduce over NCCL; expected "
           "\"nccl\" or \"compressed\"");
}

}  // namespace tessera::parallel
