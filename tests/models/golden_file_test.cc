// The PyTorch golden file (tools/golden/make_gpt_golden.py) loads: every weight, gradient
// and final weight converts to Tessera's layout, and the reference tensors have the shapes
// the model tests expect.
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "models/gpt2/hf_weights.h"
#include "models/io/safetensors.h"

namespace tessera {
namespace {

constexpr const char* kGolden = "tests/models/data/gpt_golden.safetensors";

GptConfig golden_config() {
  GptConfig cfg;
  cfg.vocab_size = 101;
  cfg.block_size = 17;
  cfg.n_layer = 3;
  cfg.n_head = 3;
  cfg.n_embd = 48;
  return cfg;
}

// The tensors whose names start with `prefix`, with the prefix removed.
StateDict with_prefix(const StateDict& sd, const std::string& prefix) {
  StateDict out;
  for (const auto& [n, t] : sd) {
    if (n.rfind(prefix, 0) == 0) out.emplace_back(n.substr(prefix.size()), t);
  }
  return out;
}

TEST_CASE("the golden file converts to Tessera's GPT state dict", "[golden]") {
  const SafetensorsFile file = read_safetensors(kGolden);
  const GptConfig cfg = golden_config();
  REQUIRE(cfg.padded_vocab_size() == 128);
  const auto expected = gpt_parameter_shapes(cfg);

  // Initial weights (the "transformer." names), gradients and final weights.
  for (const std::string prefix : {"", "grad.", "final."}) {
    INFO("prefix \"" << prefix << "\"");
    StateDict hf = with_prefix(file.tensors, prefix + "transformer.");
    for (auto& [n, t] : hf) n = "transformer." + n;
    CHECK(hf.size() == expected.size());
    const StateDict ours = hf_to_tessera(hf, cfg);
    REQUIRE(ours.size() == expected.size());
    for (size_t i = 0; i < ours.size(); ++i) {
      CHECK(ours[i].first == expected[i].first);
      CHECK(ours[i].second.shape() == expected[i].second);
      CHECK(ours[i].second.dtype() == DType::f32);
    }
    const Tensor wte = ours[0].second;
    REQUIRE(wte.shape() == Shape{128, 48});
    CHECK(wte.narrow(0, 101, 27).to_vector<double>() == std::vector<double>(27 * 48, 0.0));
    CHECK(wte.narrow(0, 0, 101).to_vector<double>() == hf.at(0).second.to_vector<double>());
  }

  std::map<std::string, Tensor> golden;
  for (const auto& [n, t] : with_prefix(file.tensors, "golden.")) golden.emplace(n, t);
  REQUIRE(golden.size() == 5);
  CHECK(golden.at("idx").dtype() == DType::i64);
  CHECK(golden.at("idx").shape() == Shape{2, 17});
  CHECK(golden.at("targets").dtype() == DType::i64);
  CHECK(golden.at("targets").shape() == Shape{2, 17});
  for (int64_t v : golden.at("idx").to_vector<int64_t>()) CHECK((v >= 0 && v < 101));
  for (int64_t v : golden.at("targets").to_vector<int64_t>()) CHECK((v >= 0 && v < 101));
  CHECK(golden.at("logits").shape() == Shape{2, 17, 101});
  CHECK(golden.at("loss").dim() == 0);
  CHECK(golden.at("adamw_losses").shape() == Shape{5});
  // The first AdamW loss is the recorded loss; training on one batch lowers it.
  const std::vector<float> losses = golden.at("adamw_losses").to_vector<float>();
  CHECK(losses[0] == golden.at("loss").item<float>());
  CHECK(losses[4] < losses[0]);

  // The metadata carries the config, which infer_hf_config confirms against the shapes.
  const GptConfig inferred =
      infer_hf_config(file.tensors, file.metadata);  // golden.*, grad.*, final.* are ignored
  CHECK(inferred.to_json() == cfg.to_json());
  CHECK(file.metadata.count("optimizer") == 1);
}

}  // namespace
}  // namespace tessera
