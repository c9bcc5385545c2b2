// Hugging Face GPT-2 weights <-> Tessera's GPT state dict (Note [GPT-2 weight layouts]).
#include "models/gpt2/hf_weights.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "models/io/safetensors.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;

GptConfig tiny_config() {
  GptConfig cfg;
  cfg.vocab_size = 10;
  cfg.block_size = 5;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 4;
  return cfg;
}

// HF GPT-2 tensors for tiny_config(), written out by hand as the official gpt2
// model.safetensors names them (no "transformer." prefix, Conv1D weights (in, out)), with
// the attention-mask buffers and, when `lm_head`, a tied lm_head.weight. Random values.
StateDict make_hf(bool bias = true, const std::string& prefix = "", bool buffers = true,
                  bool lm_head = true) {
  Generator gen(42);
  StateDict sd;
  auto add = [&](const std::string& name, const Shape& shape) {
    sd.emplace_back(prefix + name, randn(shape, gen));
  };
  add("wte.weight", {10, 4});
  add("wpe.weight", {5, 4});
  for (int i = 0; i < 2; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {4});
    if (bias) add(h + "ln_1.bias", {4});
    if (buffers) {
      sd.emplace_back(prefix + h + "attn.bias", ones({1, 1, 5, 5}));
      sd.emplace_back(prefix + h + "attn.masked_bias", scalar_tensor(-1e4));
    }
    add(h + "attn.c_attn.weight", {4, 12});
    if (bias) add(h + "attn.c_attn.bias", {12});
    add(h + "attn.c_proj.weight", {4, 4});
    if (bias) add(h + "attn.c_proj.bias", {4});
    add(h + "ln_2.weight", {4});
    if (bias) add(h + "ln_2.bias", {4});
    add(h + "mlp.c_fc.weight", {4, 16});
    if (bias) add(h + "mlp.c_fc.bias", {16});
    add(h + "mlp.c_proj.weight", {16, 4});
    if (bias) add(h + "mlp.c_proj.bias", {4});
  }
  add("ln_f.weight", {4});
  if (bias) add("ln_f.bias", {4});
  if (lm_head) sd.emplace_back("lm_head.weight", sd[0].second);
  return sd;
}

std::map<std::string, Tensor> by_name(const StateDict& sd) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : sd) REQUIRE(m.emplace(n, t).second);
  return m;
}

std::vector<std::string> names_of(const StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& [n, t] : sd) out.push_back(n);
  return out;
}

std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

bool is_conv1d(const std::string& name) {
  for (const char* s :
       {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
    const std::string suffix = s;
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return true;
    }
  }
  return false;
}

TEST_CASE("gpt_parameter_shapes lists the Gpt model's parameters", "[hf_weights]") {
  for (int variant = 0; variant < 3; ++variant) {
    GptConfig cfg = tiny_config();
    cfg.tie_word_embeddings = variant != 1;
    cfg.bias = variant != 2;
    INFO("variant " << variant);
    Gpt model(cfg, 7);
    std::vector<std::pair<std::string, Shape>> got;
    for (const NamedParameter& p : model.named_parameters())
      got.emplace_back(p.name, p.tensor.shape());
    auto want = gpt_parameter_shapes(cfg);
    // Same set; the order may differ (a Module lists its own lm_head before its children).
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    CHECK(got == want);
  }
  const auto shapes = gpt_parameter_shapes(tiny_config());
  CHECK(shapes.size() == 2 + 2 * 12 + 2);
  CHECK(shapes[0] == std::pair<std::string, Shape>{"transformer.wte.weight", {128, 4}});
  CHECK(shapes[4] == std::pair<std::string, Shape>{"transformer.h.0.attn.c_attn.weight", {12, 4}});
}

TEST_CASE("hf_to_tessera pads wte, transposes Conv1D weights and skips buffers", "[hf_weights]") {
  const GptConfig cfg = tiny_config();
  const StateDict hf = make_hf();
  const std::map<std::string, Tensor> in = by_name(hf);
  const StateDict ours = hf_to_tessera(hf, cfg);

  std::vector<std::string> want_names;
  for (const auto& [n, s] : gpt_parameter_shapes(cfg)) want_names.push_back(n);
  REQUIRE(names_of(ours) == want_names);
  for (const auto& [name, t] : ours) {
    INFO(name);
    const std::string hf_name = name.substr(std::string("transformer.").size());
    const Tensor& src = in.at(hf_name);
    if (hf_name == "wte.weight") {
      REQUIRE(t.shape() == Shape{128, 4});
      CHECK(values(t.narrow(0, 0, 10)) == values(src));
      CHECK(values(t.narrow(0, 10, 118)) == std::vector<double>(118 * 4, 0.0));
    } else if (is_conv1d(hf_name)) {
      REQUIRE(t.shape() == Shape{src.size(1), src.size(0)});
      for (int64_t o = 0; o < t.size(0); ++o) {
        for (int64_t i = 0; i < t.size(1); ++i) {
          REQUIRE(t.select(0, o).select(0, i).item<float>() ==
                  src.select(0, i).select(0, o).item<float>());
        }
      }
    } else {
      CHECK(t.shape() == src.shape());
      CHECK(values(t) == values(src));
    }
  }

  // The "transformer." prefix is optional, the buffers and the tied lm_head too.
  const StateDict prefixed = hf_to_tessera(make_hf(true, "transformer.", false, false), cfg);
  REQUIRE(names_of(prefixed) == want_names);
  for (size_t i = 0; i < ours.size(); ++i) {
    CHECK(values(prefixed[i].second) == values(ours[i].second));
  }
}

TEST_CASE("tessera_to_hf inverts hf_to_tessera", "[hf_weights]") {
  const GptConfig cfg = tiny_config();
  const StateDict hf = make_hf(true, "", false, false);
  const StateDict back = tessera_to_hf(hf_to_tessera(hf, cfg), cfg);
  REQUIRE(back.size() == hf.size());
  for (size_t i = 0; i < hf.size(); ++i) {
    INFO(hf[i].first);
    CHECK(back[i].first == "transformer." + hf[i].first);
    CHECK(back[i].second.shape() == hf[i].second.shape());
    CHECK(back[i].second.is_contiguous());
    CHECK(values(back[i].second) == values(hf[i].second));
  }
}

TEST_CASE("an untied lm_head is converted; a tied one is ignored", "[hf_weights]") {
  GptConfig cfg = tiny_config();
  StateDict hf = make_hf();
  Generator gen(3);
  hf.back().second = randn({10, 4}, gen);  // lm_head.weight, now different from wte

  const StateDict tied = hf_to_tessera(hf, cfg);
  CHECK(by_name(tied).count("lm_head.weight") == 0);

  cfg.tie_word_embeddings = false;
  const StateDict untied = hf_to_tessera(hf, cfg);
  const Tensor head = by_name(untied).at("lm_head.weight");
  REQUIRE(head.shape() == Shape{128, 4});
  CHECK(values(head.narrow(0, 0, 10)) == values(hf.back().second));
  CHECK(values(head.narrow(0, 10, 118)) == std::vector<double>(118 * 4, 0.0));
  const StateDict back = tessera_to_hf(untied, cfg);
  CHECK(back.back().first == "lm_head.weight");
  CHECK(values(back.back().second) == values(hf.back().second));

  hf.pop_back();
  CHECK_THAT(error_of([&] { hf_to_tessera(hf, cfg); }),
             Catch::Contains("missing \"lm_head.weight\" (10, 4)"));
}

TEST_CASE("a GPT without biases has no bias tensors", "[hf_weights]") {
  GptConfig cfg = tiny_config();
  cfg.bias = false;
  const StateDict ours = hf_to_tessera(make_hf(false), cfg);
  for (const auto& [n, t] : ours) CHECK(n.find(".bias") == std::string::npos);
  CHECK(ours.size() == 2 + 2 * 6 + 1);
  // Biases in the file are unexpected for such a config.
  CHECK_THAT(error_of([&] { hf_to_tessera(make_hf(true), cfg); }),
             Catch::Contains("unexpected \"h.0.attn.c_attn.bias\""));
}

TEST_CASE("hf_to_tessera reports every problem in one line", "[hf_weights]") {
  const GptConfig cfg = tiny_config();
  StateDict hf = make_hf(true, "", false, false);
  StateDict bad;
  for (auto& [n, t] : hf) {
    if (n == "h.1.ln_2.bias") continue;                                     // missing
    if (n == "h.0.attn.c_attn.weight") t = t.transpose(0, 1).contiguous();  // (out, in)
    bad.emplace_back(n, t);
  }
  bad.emplace_back("score.weight", ones({2, 4}));            // unexpected
  bad.emplace_back("transformer.wpe.weight", ones({5, 4}));  // given twice
  bad.emplace_back("h.0.ln_1.weight.x", ones({4}));          // unexpected
  const std::string e = error_of([&] { hf_to_tessera(bad, cfg); });
  CHECK(e ==
        "[hf_weights] hf_to_tessera: 5 problems: \"wpe.weight\" given twice (with and without "
        "the \"transformer.\" prefix, or repeated); \"h.0.attn.c_attn.weight\" expected a "
        "floating tensor (4, 12) (Conv1D (in, out)), found f32 (12, 4); missing "
        "\"h.1.ln_2.bias\" (4); unexpected \"h.0.ln_1.weight.x\"; unexpected \"score.weight\"");

  // Integer tensors are not weights.
  StateDict ints = make_hf(true, "", false, false);
  ints[1].second = zeros({5, 4}, {DType::i64});
  CHECK_THAT(error_of([&] { hf_to_tessera(ints, cfg); }),
             Catch::Contains("\"wpe.weight\" expected a floating tensor (5, 4), found i64 (5, 4)"));

  // A config that does not fit lists the first problems and counts the rest.
  GptConfig wide = cfg;
  wide.n_embd = 8;
  CHECK_THAT(error_of([&] { hf_to_tessera(make_hf(), wide); }),
             Catch::Contains("28 problems") && Catch::Contains("; ... and 8 more"));
}

TEST_CASE("tessera_to_hf validates the Tessera state dict", "[hf_weights]") {
  const GptConfig cfg = tiny_config();
  StateDict ours = hf_to_tessera(make_hf(), cfg);
  ours.erase(ours.begin() + 3);  // transformer.h.0.ln_1.bias
  ours.emplace_back("extra", ones({1}));
  CHECK(error_of([&] { tessera_to_hf(ours, cfg); }) ==
        "[hf_weights] tessera_to_hf: 2 problems: missing \"transformer.h.0.ln_1.bias\" (4); "
        "unexpected \"extra\"");
}

TEST_CASE("infer_hf_config reads sizes off the shapes", "[hf_weights]") {
  const GptConfig want = tiny_config();
  GptConfig cfg = infer_hf_config(make_hf());
  CHECK(cfg.vocab_size == 10);
  CHECK(cfg.block_size == 5);
  CHECK(cfg.n_layer == 2);
  CHECK(cfg.n_embd == 4);
  CHECK(cfg.bias);
  CHECK(cfg.tie_word_embeddings);
  CHECK(cfg.n_head == 0);  // not in the shapes: left to the caller

  CHECK(infer_hf_config(make_hf(), {{"n_head", "2"}}).n_head == 2);
  CHECK_THAT(error_of([&] {
               infer_hf_config(make_hf(), {{"n_head", "2x"}});
             }),
             Catch::Contains("metadata[\"n_head\"]: expected a positive integer, found \"2x\""));
  CHECK_FALSE(infer_hf_config(make_hf(false)).bias);
  CHECK(infer_hf_config(make_hf(true, "transformer.", true, false)).n_layer == 2);

  StateDict untied = make_hf();
  untied.back().second = zeros({10, 4});
  CHECK_FALSE(infer_hf_config(untied).tie_word_embeddings);

  // The full config in the metadata, as save_hf_safetensors writes it.
  GptConfig meta = want;
  meta.layer_norm_eps = 1e-6;
  const std::map<std::string, std::string> md = {{kGptConfigMetadataKey, meta.to_json().dump()}};
  cfg = infer_hf_config(make_hf(), md);
  CHECK(cfg.n_head == 2);
  CHECK(cfg.layer_norm_eps == 1e-6);
  meta.n_layer = 3;
  meta.block_size = 6;
  CHECK(error_of([&] {
          infer_hf_config(make_hf(), {{kGptConfigMetadataKey, meta.to_json().dump()}});
        }) ==
        "[hf_weights] infer_hf_config: 2 problems: block_size: the metadata config says 6, "
        "the tensors say 5; n_layer: the metadata config says 3, the tensors say 2");

  StateDict gap;
  for (const auto& [n, t] : make_hf()) {
    if (n.rfind("h.0.", 0) != 0) gap.emplace_back(n, t);
  }
  CHECK_THAT(error_of([&] { infer_hf_config(gap); }),
             Catch::Contains("expected blocks h.0 to h.0, found indices up to h.1"));
  CHECK_THAT(error_of([&] {
               infer_hf_config({{"wpe.weight", ones({5, 4})}});
             }),
             Catch::Contains("expected \"wte.weight\" (vocab_size, n_embd), found none"));
}

TEST_CASE("save_hf_safetensors and load_hf_safetensors round-trip a Gpt model", "[hf_weights]") {
  const GptConfig cfg = tiny_config();
  Gpt a(cfg, 1);
  const std::string path = testing::temp_path("gpt_hf.safetensors").string();
  save_hf_safetensors(path, a.state_dict(), cfg);

  // The file is in Hugging Face's layout and says what it holds.
  const SafetensorsFile file = read_safetensors(path);
  const std::map<std::string, Tensor> hf = by_name(file.tensors);
  CHECK(hf.at("transformer.wte.weight").shape() == Shape{10, 4});
  CHECK(hf.at("transformer.h.1.mlp.c_fc.weight").shape() == Shape{4, 16});
  CHECK(hf.count("lm_head.weight") == 0);
  CHECK(file.metadata.at("format") == "pt");
  const GptConfig inferred = infer_hf_config(file.tensors, file.metadata);
  CHECK(inferred.to_json() == cfg.to_json());

  Gpt b(cfg, 2);
  b.load_state_dict(load_hf_safetensors(path, cfg));
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(values(sb[i].second) == values(sa[i].second));
  }

  GptConfig other = cfg;
  other.block_size = 6;
  CHECK_THAT(error_of([&] { load_hf_safetensors(path, other); }),
             Catch::StartsWith("[hf_weights] " + path +
                               ": 1 problem: \"wpe.weight\" expected a "
                               "floating tensor (6, 4), found f32 (5, 4)"));
}

}  // namespace
}  // namespace tessera
