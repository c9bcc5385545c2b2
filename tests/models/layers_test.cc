// Module registry (names, state dicts, modes) and the basic layers.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/layers/dropout.h"
#include "models/layers/embedding.h"
#include "models/layers/layer_norm.h"
#include "models/layers/linear.h"

namespace tessera {
namespace {

class Block : public Module {
 public:
  explicit Block(Generator& gen) : ln_1(4), c_fc(4, 8), c_proj(8, 4, false), drop(0.5, gen) {
    register_module("ln_1", ln_1);
    register_module("mlp.c_fc", c_fc);
    register_module("mlp.c_proj", c_proj);
    register_module("drop", drop);
  }
  Tensor forward(const Tensor& x) const {
    return add(x, drop.forward(c_proj(gelu(c_fc(ln_1(x))))));
  }
  LayerNorm ln_1;
  Linear c_fc, c_proj;
  Dropout drop;
};

class Tiny : public Module {
 public:
  explicit Tiny(Generator& gen) : wte(11, 4) {
    register_module("wte", wte);
    register_module("h", h);
    for (int i = 0; i < 2; ++i) h.push_back(std::make_unique<Block>(gen));
  }
  Embedding wte;
  ModuleList h;
};

TEST_CASE("parameters carry hierarchical names in registration order", "[module]") {
  Generator gen(1);
  Tiny m(gen);
  std::vector<std::string> names;
  for (const NamedParameter& p : m.named_parameters()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"wte.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
                                          "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias",
                                          "h.0.mlp.c_proj.weight", "h.1.ln_1.weight",
                                          "h.1.ln_1.bias", "h.1.mlp.c_fc.weight",
                                          "h.1.mlp.c_fc.bias", "h.1.mlp.c_proj.weight"});
  for (const Tensor& p : m.parameters()) CHECK(p.requires_grad());
}

TEST_CASE("state_dict round-trips and load_state_dict validates before writing", "[module]") {
  Generator gen(1);
  Tiny a(gen), b(gen);
  Generator init(7);
  {
    NoGradGuard no_grad;
    for (Tensor& p : a.parameters()) p.copy_(randn(p.shape(), init));
  }
  b.load_state_dict(a.state_dict());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    CHECK(a.parameters()[i].to_vector<float>() == b.parameters()[i].to_vector<float>());
  }

  StateDict bad = a.state_dict();
  const std::vector<float> before = b.wte.weight().to_vector<float>();
  bad[1].second = zeros({5});                 // wrong shape for h.0.ln_1.weight
  bad.pop_back();                             // missing h.1.mlp.c_proj.weight
  bad.emplace_back("h.9.extra", zeros({1}));  // unexpected
  {
    NoGradGuard no_grad;
    bad[0].second = bad[0].second.clone().fill_(42.0);  // a valid change that must not land
  }
  REQUIRE_THROWS_WITH(b.load_state_dict(bad),
                      Catch::Contains("\"h.0.ln_1.weight\" expected f32 (4), found f32 (5)") &&
                          Catch::Contains("missing \"h.1.mlp.c_proj.weight\"") &&
                          Catch::Contains("unexpected \"h.9.extra\""));
  CHECK(b.wte.weight().to_vector<float>() == before);  // no partial mutation

  StateDict extra = a.state_dict();
  extra.emplace_back("unused", zeros({1}));
  b.load_state_dict(extra, /*strict=*/false);
}

TEST_CASE("train and eval propagate; dropout is identity in eval", "[module]") {
  Generator gen(3);
  Block blk(gen);
  Generator data(4);
  Tensor x = randn({2, 4}, data);
  blk.eval();
  CHECK_FALSE(blk.drop.is_training());
  const std::vector<float> y1 = blk.forward(x).to_vector<float>();
  const std::vector<float> y2 = blk.forward(x).to_vector<float>();
  CHECK(y1 == y2);
  blk.train();
  CHECK(blk.drop.is_training());
}

TEST_CASE("Linear, Embedding and LayerNorm compute what PyTorch's do", "[layers]") {
  Linear lin(3, 2);
  {
    NoGradGuard no_grad;
    lin.weight().copy_(from_vector<float>({1, 2, 3, -1, 0, 1}, {2, 3}));
    lin.bias().copy_(from_vector<float>({0.5f, -0.5f}));
  }
  Tensor y = lin(from_vector<float>({1, 1, 1, 2, 0, -1}, {2, 3}));
  CHECK(y.to_vector<float>() == std::vector<float>{6.5f, -0.5f, -0.5f, -3.5f});

  Embedding emb(4, 2);
  {
    NoGradGuard no_grad;
    emb.weight().copy_(from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}));
  }
  Tensor e = emb(from_vector<int64_t>({3, 0}));
  CHECK(e.to_vector<float>() == std::vector<float>{6, 7, 0, 1});
  backward(sum(e));
  CHECK(emb.weight().grad().to_vector<float>() == std::vector<float>{1, 1, 0, 0, 0, 0, 1, 1});

  LayerNorm ln(4);
  Tensor n = ln(from_vector<float>({1, 2, 3, 4}, {1, 4}));
  const std::vector<float> v = n.to_vector<float>();
  // (x - 2.5) / sqrt(1.25 + 1e-5)
  CHECK(v[0] == Approx(-1.5 / std::sqrt(1.25 + 1e-5)).epsilon(1e-6));
  CHECK(v[3] == Approx(1.5 / std::sqrt(1.25 + 1e-5)).epsilon(1e-6));
}

TEST_CASE("zero_grad drops gradients", "[module]") {
  Linear lin(2, 2);
  backward(sum(lin(ones({1, 2}))));
  REQUIRE(lin.weight().grad().defined());
  lin.zero_grad();
  CHECK_FALSE(lin.weight().grad().defined());
}

}  // namespace
}  // namespace tessera
