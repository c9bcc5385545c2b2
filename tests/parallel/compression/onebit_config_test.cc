// The 1-bit optimizers' config: their types registered with optim::parse_optimizer, with
// DeepSpeed's keys, defaults and errors.
#include "parallel/compression/onebit_config.h"

#include <string>
#include <vector>

#include "core/json.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using testing::error_of;

// The optimizer section of `text`; the reader's warnings go to `warnings` when given.
optim::OptimizerConfig optimizer_from(const std::string& text,
                                      std::vector<std::string>* warnings = nullptr) {
  const nlohmann::json doc = parse_json(text);
  JsonObjectReader r(doc, "config");
  optim::OptimizerConfig c =
      optim::parse_optimizer(r.required_object("optimizer"), onebit_optimizer_types());
  r.finish();
  if (warnings) *warnings = r.warnings();
  return c;
}

TEST_CASE("the 1-bit optimizers read DeepSpeed's keys and defaults") {
  std::vector<std::string> warnings;
  const optim::OptimizerConfig adam =
      optimizer_from(R"({"optimizer": {"type": "OneBitAdam", "params":
      {"lr": 2e-4, "freeze_step": 400, "betas": [0.8, 0.99], "cuda_aware": false,
       "comm_backend_name": "mpi"}}})",
                     &warnings);
  REQUIRE(onebit_config(adam) != nullptr);
  CHECK(onebit_config(adam)->kind == OneBitKind::adam);
  CHECK(onebit_config(adam)->options.freeze_step == 400);
  CHECK(adam.adam.beta1 == 0.8);
  CHECK_FALSE(adam.adam.bias_correction);
  // cuda_aware takes no effect and says so; comm_backend_name is checked against the run.
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("$.optimizer.params.cuda_aware is ignored"));
  CHECK(onebit_config(adam)->options.comm_backend == "mpi");
  check_comm_backend(adam, false);
  CHECK(error_of([&] { check_comm_backend(adam, true); }) ==
        "[config] $.optimizer.params.comm_backend_name: \"mpi\" compresses over MPI, and this "
        "CUDA run's ranks reduce over NCCL; expected \"nccl\" or \"compressed\"");
  const optim::OptimizerConfig nccl = optimizer_from(
      R"({"optimizer": {"type": "OneBitAdam", "params": {"comm_backend_name": "nccl"}}})");
  check_comm_backend(nccl, true);
  CHECK(error_of([&] { check_comm_backend(nccl, false); }) ==
        "[config] $.optimizer.params.comm_backend_name: \"nccl\" compresses over NCCL, which "
        "Tessera's data-parallel ranks use on CUDA devices; expected \"mpi\" or "
        "\"compressed\" for this CPU run, or trainer.device \"cuda\"");
  const optim::OptimizerConfig compressed = optimizer_from(
      R"({"optimizer": {"type": "OneBitAdam", "params": {"comm_backend_name": "compressed"}}})");
  check_comm_backend(compressed, false);
  check_comm_backend(compressed, true);
  CHECK(onebit_config(optim::OptimizerConfig{}) == nullptr);

  const optim::OptimizerConfig zo = optimizer_from(R"({"optimizer": {"type": "zerooneadam"}})");
  REQUIRE(onebit_config(zo) != nullptr);
  CHECK(onebit_config(zo)->kind == OneBitKind::zero_one_adam);
  CHECK(onebit_config(zo)->options.var_freeze_step == 100000);
  CHECK(onebit_config(zo)->options.var_update_scaler == 16);
  CHECK(onebit_config(zo)->options.local_step_scaler == 32678);
  CHECK(onebit_config(zo)->options.local_step_clipper == 16);

  const optim::OptimizerConfig lamb =
      optimizer_from(R"({"optimizer": {"type": "OneBitLamb", "params":
      {"max_coeff": 0.3, "min_coeff": 0.01, "coeff_beta": 0.8, "factor_max": 2.0}}})");
  REQUIRE(onebit_config(lamb) != nullptr);
  CHECK(onebit_config(lamb)->kind == OneBitKind::lamb);
  CHECK(lamb.lamb.max_coeff == 0.3);
  CHECK(onebit_config(lamb)->options.coeff_beta == 0.8);
  CHECK(onebit_config(lamb)->options.factor_max == 2.0);
  CHECK(onebit_config(lamb)->options.factor_min == 0.5);
  CHECK(onebit_config(lamb)->options.factor_threshold == 0.1);
  CHECK(onebit_config(lamb)->options.freeze_step == 100000);

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
  CHECK_THROWS_WITH(
      optim::make_optimizer(adam, {}),
      Catch::Contains("found OneBitAdam, which is built by the code that registered it"));
  CHECK_THAT(error_of([] { optimizer_from(R"({"optimizer": {"type": "Adagrad"}})"); }),
             Catch::Contains("$.optimizer.type: expected one of Adam, AdamW, Lamb, SGD, "
                             "OneBitAdam, ZeroOneAdam, OneBitLamb, found \"Adagrad\""));
}

}  // namespace
}  // namespace tessera::parallel
