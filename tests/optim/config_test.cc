// The optimizer and scheduler config sections: DeepSpeed's keys, defaults and errors.
#include "optim/config.h"

#include "core/json.h"
#include "tests/testing.h"

namespace tessera::optim {
namespace {

using testing::error_of;

OptimizerConfig optimizer_from(const std::string& text) {
  const nlohmann::json doc = parse_json(text);
  JsonObjectReader r(doc, "config");
  OptimizerConfig c = parse_optimizer(r.required_object("optimizer"));
  r.finish();
  return c;
}

TEST_CASE("Adam defaults to AdamW mode as in DeepSpeed") {
  const OptimizerConfig c = optimizer_from(
      R"({"optimizer": {"type": "adam", "params": {"lr": 0.002, "betas": [0.8, 0.99],
          "eps": 1e-9, "weight_decay": 0.1}}})");
  CHECK(c.type == OptimizerType::adam);
  CHECK(c.adam.adam_w_mode);
  CHECK(c.lr == 0.002);
  CHECK(c.adam.beta1 == 0.8);
  CHECK(c.adam.beta2 == 0.99);
  CHECK(c.adam.eps == 1e-9);
  CHECK(c.weight_decay == 0.1);
  CHECK_FALSE(optimizer_from(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
                  .adam.adam_w_mode);
}

TEST_CASE("optimizer errors name the key and keep DeepSpeed's wording") {
  CHECK_THAT(
      error_of([] {
        optimizer_from(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1}}})");
      }),
      Catch::Contains("'max_grad_norm' is not supported as an optimizer parameter"));
  CHECK_THAT(error_of([] { optimizer_from(R"({"optimizer": {"type": "Adagrad"}})"); }),
             Catch::Contains("$.optimizer.type: expected one of Adam, AdamW, Lamb, SGD, "
                             "OneBitAdam, ZeroOneAdam, OneBitLamb, found \"Adagrad\""));
  CHECK_THAT(
      error_of([] {
        optimizer_from(R"({"optimizer": {"type": "AdamW", "params": {"lr": 1, "bettas": []}}})");
      }),
      Catch::Contains("unknown key $.optimizer.params.bettas; did you mean \"betas\"?"));
  CHECK_THAT(error_of([] {
               optimizer_from(R"({"optimizer": {"type": "adam", "params": {"betas": [0.9]}}})");
             }),
             Catch::Contains("$.optimizer.params.betas: expected two numbers in [0, 1)"));
  CHECK_THAT(error_of([] { optimizer_from(R"({"optimizer": {"type": "sgd", "params": {}}})"); }),
             Catch::Contains("$.optimizer.params.lr: required key missing"));
}

std::unique_ptr<LrSchedule> scheduler_from(const std::string& text, double base_lr) {
  const nlohmann::json doc = parse_json(text);
  JsonObjectReader r(doc, "config");
  auto s = parse_scheduler(r.required_object("scheduler"), base_lr);
  r.finish();
  return s;
}

TEST_CASE("the 1-bit optimizers read DeepSpeed's keys and defaults") {
  const OptimizerConfig adam = optimizer_from(R"({"optimizer": {"type": "OneBitAdam", "params":
      {"lr": 2e-4, "freeze_step": 400, "betas": [0.8, 0.99], "cuda_aware": false,
       "comm_backend_name": "mpi"}}})");
  CHECK(adam.type == OptimizerType::onebit_adam);
  CHECK(adam.onebit.freeze_step == 400);
  CHECK(adam.adam.beta1 == 0.8);
  CHECK_FALSE(adam.adam.bias_correction);
  CHECK(adam.onebit.comm_backend_name == "mpi");
  CHECK(is_onebit(adam.type));
  CHECK_FALSE(is_onebit(OptimizerType::lamb));

  const OptimizerConfig zo = optimizer_from(R"({"optimizer": {"type": "zerooneadam"}})");
  CHECK(zo.type == OptimizerType::zero_one_adam);
  CHECK(zo.onebit.var_freeze_step == 100000);
  CHECK(zo.onebit.var_update_scaler == 16);
  CHECK(zo.onebit.local_step_scaler == 32678);
  CHECK(zo.onebit.local_step_clipper == 16);

  const OptimizerConfig lamb = optimizer_from(R"({"optimizer": {"type": "OneBitLamb", "params":
      {"max_coeff": 0.3, "min_coeff": 0.01, "coeff_beta": 0.8, "factor_max": 2.0}}})");
  CHECK(lamb.type == OptimizerType::onebit_lamb);
  CHECK(lamb.lamb.max_coeff == 0.3);
  CHECK(lamb.onebit.coeff_beta == 0.8);
  CHECK(lamb.onebit.factor_max == 2.0);
  CHECK(lamb.onebit.factor_min == 0.5);
  CHECK(lamb.onebit.factor_threshold == 0.1);
  CHECK(lamb.onebit.freeze_step == 100000);

  CHECK_THAT(error_of([] {
               optimizer_from(
                   R"({"optimizer": {"type": "OneBitAdam", "params": {"bias_correction": true}}})");
             }),
             Catch::Contains("$.optimizer.params.bias_correction is not supported: the 1-bit "
                             "optimizers apply no bias correction"));
  CHECK_THAT(
      error_of([] {
        optimizer_from(R"({"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 1}}})");
      }),
      Catch::Contains("$.optimizer.params.freeze_step"));
  CHECK_THAT(error_of([] {
               optimizer_from(R"({"optimizer": {"type": "OneBitLamb", "params":
                   {"comm_backend_name": "hccl"}}})");
             }),
             Catch::Contains("$.optimizer.params.comm_backend_name"));
  CHECK_THAT(error_of([] {
               optimizer_from(R"({"optimizer": {"type": "OneBitLamb", "params":
                   {"factor_min": 5.0}}})");
             }),
             Catch::Contains("expected factor_min <= factor_max (4), found 5"));
  CHECK_THAT(error_of([] {
               optimizer_from(R"({"optimizer": {"type": "ZeroOneAdam", "params":
                   {"freeze_step": 10}}})");
             }),
             Catch::Contains("unknown key $.optimizer.params.freeze_step"));
  CHECK_THROWS_WITH(make_optimizer(adam, {}),
                    Catch::Contains("expected them built by parallel::ZeroOptimizer"));
}

TEST_CASE("scheduler sections build DeepSpeed's schedules") {
  auto cos = scheduler_from(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 100, "warmup_num_steps": 10, "warmup_type": "linear",
      "cos_min_ratio": 0.1}}})",
                            1e-3);
  CHECK(cos->name() == "WarmupCosineLR");
  CHECK(cos->lr_at(5) == Approx(0.5e-3));   // linear warmup: t / W'
  CHECK(cos->lr_at(99) == Approx(0.1e-3));  // the cosine ends at cos_min_ratio
  auto warm = scheduler_from(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 4}}})",
      1.0);
  CHECK(warm->lr_at(100) == Approx(0.01));
  CHECK_THAT(error_of([] {
               scheduler_from(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})", 1.0);
             }),
             Catch::Contains("$.scheduler.params.total_num_steps: required key missing"));
  CHECK_THAT(error_of([] { scheduler_from(R"({"scheduler": {"type": "StepLR"}})", 1.0); }),
             Catch::Contains("$.scheduler.type"));
}

}  // namespace
}  // namespace tessera::optim
