// The optimizer and scheduler config sections: DeepSpeed's keys, defaults and errors.
#include "optim/config.h"

#include <memory>
#include <string>
#include <vector>

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
             Catch::Contains("$.optimizer.type: expected one of Adam, AdamW, Lamb, SGD, found "
                             "\"Adagrad\""));
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

// A type optim/ does not know, registered by its caller (Note [External optimizers]).
struct Lion final : ExternalOptimizer {
  double beta = 0;
  std::string name() const override { return "Lion"; }
};

TEST_CASE("external optimizer types are parsed by the parser registered for them") {
  const std::vector<ExternalOptimizerType> external = {
      {"Lion", [](JsonObjectReader& params, OptimizerConfig& c) {
         auto lion = std::make_shared<Lion>();
         lion->beta = params.get<double>("beta", 0.99);
         c.adam.bias_correction = false;
         return lion;
       }}};
  const nlohmann::json doc =
      parse_json(R"({"optimizer": {"type": "lion", "params": {"lr": 3e-4, "beta": 0.9}}})");
  JsonObjectReader r(doc, "config");
  const OptimizerConfig c = parse_optimizer(r.required_object("optimizer"), external);
  r.finish();
  CHECK(c.type == OptimizerType::external);
  CHECK(c.lr == 3e-4);
  REQUIRE(dynamic_cast<const Lion*>(c.external.get()) != nullptr);
  CHECK(dynamic_cast<const Lion&>(*c.external).beta == 0.9);
  CHECK_FALSE(c.adam.bias_correction);
  CHECK_THROWS_WITH(make_optimizer(c, {}),
                    Catch::Contains("found Lion, which is built by the code that registered it"));
  // Without the registration the type is unknown, and the registered names are listed.
  CHECK_THAT(error_of([] { optimizer_from(R"({"optimizer": {"type": "lion"}})"); }),
             Catch::Contains("expected one of Adam, AdamW, Lamb, SGD, found \"lion\""));
  const nlohmann::json bad = parse_json(R"({"optimizer": {"type": "Adagrad"}})");
  JsonObjectReader rb(bad, "config");
  CHECK_THAT(error_of([&] { parse_optimizer(rb.required_object("optimizer"), external); }),
             Catch::Contains("expected one of Adam, AdamW, Lamb, SGD, Lion, found \"Adagrad\""));
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
