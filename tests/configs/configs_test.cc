// Every config in configs/ passes the strict run-config validation.
#include <catch2/catch.hpp>
#include <filesystem>

#include "core/json.h"
#include "models/gpt2/spec.h"
#include "tools/trainer/run_config.h"

namespace tessera::train {
namespace {

TEST_CASE("every shipped config parses") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("configs")) {
    if (e.path().extension() != ".json") continue;
    INFO(e.path().string());
    // The smallest world the config's pipeline and tensor slicing fit.
    const nlohmann::json doc = parse_json_file(e.path().string());
    const int64_t world =
        doc.value("pipeline", nlohmann::json::object()).value("stages", 1) *
        doc.value("tensor_parallel", nlohmann::json::object()).value("tp_size", 1);
    const RunConfig c = load_run_config(e.path().string(), world);
    CHECK(c.warnings.empty());
    CHECK(c.trainer.steps > 0);
    ++n;
  }
  CHECK(n >= 3);
}

TEST_CASE("shakespeare_char is nanoGPT's CPU baby GPT") {
  const RunConfig c = load_run_config("configs/shakespeare_char.json");
  REQUIRE(c.model->type() == "gpt2");
  const GptConfig& m = dynamic_cast<const GptSpec&>(*c.model).config();
  CHECK(m.n_layer == 4);
  CHECK(m.n_head == 4);
  CHECK(m.n_embd == 128);
  CHECK(m.block_size == 64);
  CHECK(m.dropout == 0.0);
  CHECK(c.engine.batch.train_micro_batch_size_per_gpu == 12);
  CHECK(c.trainer.steps == 2000);
  CHECK(c.engine.optimizer.lr == 1e-3);
  CHECK(c.engine.scheduler->lr_at(1999) == Approx(1e-4));  // cosine down to 1e-4
}

}  // namespace
}  // namespace tessera::train
