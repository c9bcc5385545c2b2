// Every config in configs/ passes the strict run-config validation.
#include <catch2/catch.hpp>
#include <filesystem>

#include "tools/trainer/run_config.h"

namespace tessera::train {
namespace {

TEST_CASE("every shipped config parses") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("configs")) {
    if (e.path().extension() != ".json") continue;
    INFO(e.path().string());
    const RunConfig c = load_run_config(e.path().string());
    CHECK(c.warnings.empty());
    CHECK(c.trainer.steps > 0);
    ++n;
  }
  CHECK(n >= 3);
}

TEST_CASE("shakespeare_char is nanoGPT's CPU baby GPT") {
  const RunConfig c = load_run_config("configs/shakespeare_char.json");
  CHECK(c.model.n_layer == 4);
  CHECK(c.model.n_head == 4);
  CHECK(c.model.n_embd == 128);
  CHECK(c.model.block_size == 64);
  CHECK(c.model.dropout == 0.0);
  CHECK(c.engine.batch.train_micro_batch_size_per_gpu == 12);
  CHECK(c.trainer.steps == 2000);
  CHECK(c.engine.optimizer.lr == 1e-3);
  CHECK(c.engine.scheduler->lr_at(1999) == Approx(1e-4));  // cosine down to 1e-4
}

}  // namespace
}  // namespace tessera::train
