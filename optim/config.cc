#include "optim/config.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace tessera::optim {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// DeepSpeed rejects these for every optimizer; keep its words so that searches find them.
void reject_common(JsonObjectReader& params) {
  TS_CHECK(!params.has("max_grad_norm"), "[config] ", params.key_path("max_grad_norm"),
           ": 'max_grad_norm' is not supported as an optimizer parameter, please switch to using "
           "the deepspeed parameter 'gradient_clipping' see: "
           "https://www.deepspeed.ai/docs/config-json/#gradient-clipping for more details");
  if (params.get<bool>("amsgrad", false)) {
    params.unsupported("amsgrad", "expected false; AMSGrad is not implemented");
  }
}

WarmupType read_warmup_type(JsonObjectReader& p) {
  return p.get_one_of("warmup_type", "log", {"log", "linear"}) == "log" ? WarmupType::log
                                                                        : WarmupType::linear;
}

WarmupParams read_warmup(JsonObjectReader& p) {
  WarmupParams w;
  w.warmup_min_lr = p.get_in_range<double>("warmup_min_lr", w.warmup_min_lr, 0.0, 1e9);
  w.warmup_max_lr = p.get_in_range<double>("warmup_max_lr", w.warmup_max_lr, 0.0, 1e9);
  w.warmup_num_steps = p.get_in_range<int64_t>("warmup_num_steps", w.warmup_num_steps, 0,
                                               std::numeric_limits<int64_t>::max());
  w.warmup_type = read_warmup_type(p);
  return w;
}

}  // namespace

void read_betas(JsonObjectReader& params, double* beta1, double* beta2) {
  const std::optional<std::vector<double>> betas = params.optional<std::vector<double>>("betas");
  if (!betas) return;
  TS_CHECK(betas->size() == 2 && (*betas)[0] >= 0 && (*betas)[0] < 1 && (*betas)[1] >= 0 &&
               (*betas)[1] < 1,
           "[config] ", params.key_path("betas"), ": expected two numbers in [0, 1), found ",
           params.raw("betas")->dump());
  *beta1 = (*betas)[0];
  *beta2 = (*betas)[1];
}

void read_lamb_coeffs(JsonObjectReader& params, LambOptions* lamb) {
  lamb->max_coeff = params.get_in_range<double>("max_coeff", lamb->max_coeff, 0.0, 1e9);
  lamb->min_coeff = params.get_in_range<double>("min_coeff", lamb->min_coeff, 0.0, 1e9);
  TS_CHECK(lamb->min_coeff <= lamb->max_coeff, "[config] ", params.key_path("min_coeff"),
           ": expected min_coeff <= max_coeff (", lamb->max_coeff, "), found ", lamb->min_coeff);
}

bool same_optimizer_type(const std::string& a, const std::string& b) {
  return lower(a) == lower(b);
}

OptimizerConfig parse_optimizer(JsonObjectReader section,
                                const std::vector<ExternalOptimizerType>& external) {
  OptimizerConfig c;
  const std::string type = lower(section.required<std::string>("type"));
  section.ignored("legacy_fusion", "Tessera has one fused implementation per optimizer");
  JsonObjectReader params = section.object("params");
  reject_common(params);
  c.lr = params.get_in_range<double>("lr", c.lr, 0.0, 1e9);
  c.weight_decay = params.get_in_range<double>("weight_decay", 0.0, 0.0, 1e9);
  if (type == "adam" || type == "adamw") {
    c.type = OptimizerType::adam;
    read_betas(params, &c.adam.beta1, &c.adam.beta2);
    c.adam.eps = params.get_in_range<double>("eps", c.adam.eps, 0.0, 1.0);
    c.adam.bias_correction = params.get<bool>("bias_correction", true);
    c.adam.adam_w_mode = params.get<bool>("adam_w_mode", true);
    TS_CHECK(type == "adam" || c.adam.adam_w_mode, "[config] ", params.key_path("adam_w_mode"),
             ": AdamW always decays decoupled; expected true (or type \"Adam\"), found false");
    params.ignored("torch_adam", "Tessera always uses its fused Adam kernel");
  } else if (type == "sgd") {
    c.type = OptimizerType::sgd;
    c.lr = params.required_in_range<double>("lr", 0.0, 1e9);
    c.sgd.momentum = params.get_in_range<double>("momentum", 0.0, 0.0, 1.0);
    c.sgd.dampening = params.get_in_range<double>("dampening", 0.0, 0.0, 1.0);
    c.sgd.nesterov = params.get<bool>("nesterov", false);
    TS_CHECK(!c.sgd.nesterov || (c.sgd.momentum > 0 && c.sgd.dampening == 0), "[config] ",
             params.key_path("nesterov"),
             ": Nesterov momentum requires a momentum and zero dampening");
  } else if (type == "lamb") {
    c.type = OptimizerType::lamb;
    read_betas(params, &c.lamb.beta1, &c.lamb.beta2);
    c.lamb.eps = params.get_in_range<double>("eps", c.lamb.eps, 0.0, 1.0);
    c.lamb.bias_correction = params.get<bool>("bias_correction", true);
    c.lamb.eps_inside_sqrt = params.get<bool>("eps_inside_sqrt", false);
    read_lamb_coeffs(params, &c.lamb);
  } else if (const auto it = std::find_if(
                 external.begin(), external.end(),
                 [&](const ExternalOptimizerType& e) { return lower(e.name) == type; });
             it != external.end()) {
    c.type = OptimizerType::external;
    c.external = it->parse(params, c);
  } else {
    std::string names = "Adam, AdamW, Lamb, SGD";
    for (const ExternalOptimizerType& e : external) names += ", " + e.name;
    TS_FAIL("[config] ", section.key_path("type"), ": expected one of ", names, ", found \"",
            section.required<std::string>("type"), "\"");
  }
  return c;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config,
                                          std::vector<ParamGroup> groups) {
  switch (config.type) {
    case OptimizerType::adam:
      return std::make_unique<Adam>(std::move(groups), config.adam);
    case OptimizerType::sgd:
      return std::make_unique<Sgd>(std::move(groups), config.sgd);
    case OptimizerType::lamb:
      return std::make_unique<Lamb>(std::move(groups), config.lamb);
    case OptimizerType::external:
      TS_FAIL("[optimizer] make_optimizer: expected a type optim/ builds, found ",
              config.external->name(),
              ", which is built by the code that registered it (Note [External optimizers])");
  }
  TS_INTERNAL_ASSERT(false, "unhandled optimizer type");
  return nullptr;
}

std::unique_ptr<LrSchedule> parse_scheduler(JsonObjectReader section, double base_lr) {
  const std::string type = section.required_one_of(
      "type", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"});
  JsonObjectReader p = section.object("params");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (type == "WarmupLR") return std::make_unique<WarmupLR>(read_warmup(p));
  if (type == "WarmupDecayLR") {
    const WarmupParams w = read_warmup(p);
    return std::make_unique<WarmupDecayLR>(
        w, p.required_in_range<int64_t>("total_num_steps", 1, kMax));
  }
  if (type == "WarmupCosineLR") {
    WarmupCosineParams c;
    c.total_num_steps = p.required_in_range<int64_t>("total_num_steps", 1, kMax);
    c.warmup_min_ratio = p.get_in_range<double>("warmup_min_ratio", c.warmup_min_ratio, 0.0, 1.0);
    c.warmup_num_steps = p.get_in_range<int64_t>("warmup_num_steps", c.warmup_num_steps, 0, kMax);
    c.cos_min_ratio = p.get_in_range<double>("cos_min_ratio", c.cos_min_ratio, 0.0, 1.0);
    c.warmup_type = read_warmup_type(p);
    return std::make_unique<WarmupCosineLR>(c, base_lr);
  }
  if (type == "OneCycle") {
    OneCycleParams o;
    o.cycle_min_lr = p.required_in_range<double>("cycle_min_lr", 0.0, 1e9);
    o.cycle_max_lr = p.required_in_range<double>("cycle_max_lr", 0.0, 1e9);
    o.decay_lr_rate = p.get_in_range<double>("decay_lr_rate", 0.0, 0.0, 1e9);
    o.cycle_first_step_size =
        p.get_in_range<int64_t>("cycle_first_step_size", o.cycle_first_step_size, 1, kMax);
    o.cycle_second_step_size = p.optional<int64_t>("cycle_second_step_size");
    TS_CHECK(!o.cycle_second_step_size || *o.cycle_second_step_size >= 1, "[config] ",
             p.key_path("cycle_second_step_size"), ": expected an integer >= 1, found ",
             *o.cycle_second_step_size);
    p.ignored("cycle_first_stair_count", "DeepSpeed's OneCycle does not use stair counts");
    p.ignored("cycle_second_stair_count", "DeepSpeed's OneCycle does not use stair counts");
    o.decay_step_size = p.get_in_range<int64_t>("decay_step_size", 0, 0, kMax);
    o.cycle_momentum = p.get<bool>("cycle_momentum", true);
    o.cycle_min_mom = p.get_in_range<double>("cycle_min_mom", o.cycle_min_mom, 0.0, 1.0);
    o.cycle_max_mom = p.get_in_range<double>("cycle_max_mom", o.cycle_max_mom, 0.0, 1.0);
    o.decay_mom_rate = p.get_in_range<double>("decay_mom_rate", 0.0, 0.0, 1e9);
    return std::make_unique<OneCycle>(o);
  }
  LRRangeTestParams r;
  r.lr_range_test_min_lr =
      p.get_in_range<double>("lr_range_test_min_lr", r.lr_range_test_min_lr, 0.0, 1e9);
  r.lr_range_test_step_size =
      p.get_in_range<int64_t>("lr_range_test_step_size", r.lr_range_test_step_size, 1, kMax);
  r.lr_range_test_step_rate =
      p.get_in_range<double>("lr_range_test_step_rate", r.lr_range_test_step_rate, 0.0, 1e9);
  r.lr_range_test_staircase = p.get<bool>("lr_range_test_staircase", false);
  return std::make_unique<LRRangeTest>(r);
}

}  // namespace tessera::optim
