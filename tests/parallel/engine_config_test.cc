// parse_engine_config on its own: the engine keys of a run config's root, strictly read
// (Note [Strict config reading] in core/json.h). The whole run config is tested in
// tests/tools/trainer/run_config_test.cc.
#include "parallel/engine_config.h"

#include <functional>
#include <string>

#include "core/json.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using Catch::Contains;
using Json = nlohmann::json;
using testing::error_of;

// The fewest engine keys that parse.
Json minimal_config() {
  return parse_json(R"({
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}
  })",
                    "minimal_config");
}

// The engine config of minimal_config() after `edit`, with the root finished so that
// unknown keys are errors.
EngineConfig parse_edited(const std::function<void(Json&)>& edit) {
  Json doc = minimal_config();
  edit(doc);
  JsonObjectReader root(doc, "config");
  EngineConfig c = parse_engine_config(root);
  root.finish();
  return c;
}

std::string error_after(const std::function<void(Json&)>& edit) {
  return error_of([&] { parse_edited(edit); });
}

TEST_CASE("simulated_network sets the modeled link", "[engine_config]") {
  const EngineConfig off = parse_edited([](Json&) {});
  CHECK_FALSE(off.simulated_link.enabled());
  CHECK(off.simulated_link.latency_us == 0);

  const EngineConfig on = parse_edited([](Json& d) {
    d["simulated_network"] = {{"bandwidth_gbps", 1.0}, {"latency_us", 50}};
  });
  CHECK(on.simulated_link.enabled());
  CHECK(on.simulated_link.gbit_per_s == 1.0);
  CHECK(on.simulated_link.latency_us == 50);

  const EngineConfig no_latency = parse_edited([](Json& d) {
    d["simulated_network"] = {{"bandwidth_gbps", 0.25}};
  });
  CHECK(no_latency.simulated_link.gbit_per_s == 0.25);
  CHECK(no_latency.simulated_link.latency_us == 0);
}

TEST_CASE("bad simulated_network values name their key", "[engine_config]") {
  CHECK_THAT(error_after([](Json& d) {
               d["simulated_network"] = {{"bandwidth_gbps", 0}};
             }),
             Contains("[config] $.simulated_network.bandwidth_gbps: expected the simulated "
                      "link's bandwidth in Gbit/s, > 0"));
  CHECK_THAT(error_after([](Json& d) {
               d["simulated_network"] = {{"bandwidth_gbps", -2}};
             }),
             Contains("$.simulated_network.bandwidth_gbps"));
  CHECK_THAT(error_after([](Json& d) {
               d["simulated_network"] = {{"bandwidth_gbps", 1}, {"latency_us", -1}};
             }),
             Contains("$.simulated_network.latency_us: expected"));
  CHECK_THAT(error_after([](Json& d) {
               d["simulated_network"] = {{"latency_us", 50}};
             }),
             Contains("$.simulated_network.bandwidth_gbps: required key missing"));
  CHECK_THAT(error_after([](Json& d) {
               d["simulated_network"] = {{"bandwidth_gbps", 1}, {"latency_usec", 5}};
             }),
             Contains("unknown key $.simulated_network.latency_usec; did you mean \"latency_us\""));
  CHECK_THAT(error_after([](Json& d) { d["simulated_network"] = 1.0; }),
             Contains("$.simulated_network"));
  CHECK_THAT(error_after([](Json& d) {
               d["simulated_network"] = {{"bandwidth_gbps", "fast"}};
             }),
             Contains("$.simulated_network.bandwidth_gbps: expected"));
}

}  // namespace
}  // namespace tessera::parallel
