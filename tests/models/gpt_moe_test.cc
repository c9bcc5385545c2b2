// GPT with mixture-of-experts blocks (Note [GPT-MoE] in models/gpt2/moe_config.h): the
// config section, parameter counts, the loss's load-balancing term, training, cached
// generation, and the layouts not supported yet.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/gpt2/gpt.h"
#include "models/gpt2/kv_cache.h"
#include "optim/adam.h"
#include "parallel/comm/thread_comm.h"
#include "tests/tiny_gpt.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

// 4 layers, width 16, vocabulary 29; blocks 1 and 3 have 2 and 4 experts (a pyramid).
GptConfig moe_config(int k = 2) {
  Json model = {{"type", "gpt2"},
                {"vocab_size", 29},
                {"block_size", 16},
                {"n_layer", 4},
                {"n_head", 2},
                {"n_embd", 16},
                {"moe",
                 {{"num_experts", {2, 4}},
                  {"k", k},
                  {"min_capacity", 0},
                  {"use_rts", false},
                  {"top2_2nd_expert_sampling", false},
                  {"aux_loss_coef", 0.5}}}};
  return GptConfig::from_json(JsonObjectReader(model, "config", "$.model"));
}

Tensor random_ids(int64_t B, int64_t T, uint64_t seed) {
  Generator g(seed);
  return rand({B, T}, g, {}, 0.0, 29.0).to(DType::i64);
}

TEST_CASE("the moe section reads DeepSpeed's names and round-trips", "[gpt][moe]") {
  const GptConfig cfg = moe_config();
  REQUIRE(cfg.moe);
  CHECK(cfg.moe->num_experts == std::vector<int64_t>{2, 4});
  CHECK(cfg.moe->moe_every == 2);
  CHECK(cfg.moe->gate.k == 2);
  CHECK(cfg.moe->aux_loss_coef == 0.5);
  CHECK_FALSE(cfg.moe->is_moe_block(0));
  CHECK(cfg.moe->is_moe_block(1));
  CHECK(cfg.moe->experts_at(3) == 4);
  const GptConfig again =
      GptConfig::from_json(JsonObjectReader(cfg.to_json(), "config", "$.model"));
  CHECK(again.to_json() == cfg.to_json());

  Json bad = cfg.to_json();
  bad["moe"]["num_experts"] = {2, 4, 8};
  CHECK_THROWS_WITH(GptConfig::from_json(JsonObjectReader(bad, "config", "$.model")),
                    Catch::Contains("one per MoE block (2 with n_layer 4"));
  bad = cfg.to_json();
  bad["moe"]["ep_size"] = 2;  // splits both blocks' experts
  CHECK(GptConfig::from_json(JsonObjectReader(bad, "config", "$.model")).moe->ep_size == 2);
  bad["moe"]["ep_size"] = 4;
  CHECK_THROWS_WITH(
      GptConfig::from_json(JsonObjectReader(bad, "config", "$.model")),
      Catch::Contains("ep_size: expected a divisor of every num_experts (2), found 4"));
  bad = cfg.to_json();
  bad["moe"]["capacity"] = 2;
  CHECK_THROWS_WITH(GptConfig::from_json(JsonObjectReader(bad, "config", "$.model")),
                    Catch::Contains("capacity"));
}

TEST_CASE("an MoE GPT's parameters are its experts', counted by num_parameters", "[gpt][moe]") {
  const GptConfig cfg = moe_config();
  const Gpt model(cfg, 1);
  int64_t n = 0;
  std::vector<std::string> names;
  for (const NamedParameter& p : model.named_parameters()) {
    n += p.tensor.numel();
    names.push_back(p.name);
  }
  CHECK(n == cfg.num_parameters());
  const auto has = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  CHECK(has("transformer.h.0.mlp.c_fc.weight"));
  CHECK(has("transformer.h.1.mlp.gate.weight"));
  CHECK(has("transformer.h.1.mlp.experts.1.c_proj.weight"));
  CHECK_FALSE(has("transformer.h.1.mlp.experts.2.c_fc.weight"));
  CHECK(has("transformer.h.3.mlp.experts.3.c_fc.bias"));
  // Active: each MoE block's gate and k = 2 experts, as a dense MLP twice.
  const int64_t mlp = 2 * 16 * 64 + 64 + 16;
  GptConfig dense = cfg;
  dense.moe.reset();
  CHECK(cfg.active_parameters() == dense.num_parameters() + 2 * mlp + 16 * 2 + 16 * 4);
  // Residual MoE adds a dense MLP and a 2-way coefficient per MoE block.
  GptConfig residual = cfg;
  residual.moe->use_residual = true;
  int64_t with_residual = 0;
  for (const NamedParameter& p : Gpt(residual, 1).named_parameters()) {
    with_residual += p.tensor.numel();
  }
  CHECK(with_residual == residual.num_parameters());
  CHECK(residual.num_parameters() == cfg.num_parameters() + 2 * (mlp + 2 * 16 + 2));
}

TEST_CASE("the loss adds aux_loss_coef times the blocks' load-balancing losses", "[gpt][moe]") {
  const GptConfig cfg = moe_config();
  Gpt model(cfg, 3);
  const Tensor ids = random_ids(2, 16, 5), targets = random_ids(2, 16, 6);
  NoGradGuard no_grad;
  const Tensor logits = model.forward(ids);
  REQUIRE(model.moe_outputs().size() == 2);
  double aux = 0;
  for (const moe::MoeOutput& m : model.moe_outputs()) {
    aux += m.l_aux.item<double>();
    CHECK_FALSE(m.output.defined());  // not kept beyond the forward
  }
  const double total = model.loss(logits, targets).item<double>();
  GptConfig plain_cfg = cfg;
  plain_cfg.moe->aux_loss_coef = 0.0;
  const Gpt plain(plain_cfg, 3);
  const double ce = plain.loss(plain.forward(ids), targets).item<double>();
  CHECK(total == Approx(ce + 0.5 * aux).epsilon(1e-5));
}

TEST_CASE("training forwards count each block's expert load until taken", "[gpt][moe]") {
  Gpt model(moe_config(), 3);
  const Tensor ids = random_ids(2, 16, 5);
  NoGradGuard no_grad;
  model.forward(ids);
  model.forward(ids);
  model.eval();
  model.forward(ids);  // not counted
  const std::vector<parallel::ExpertLoad> load = model.take_expert_load();
  REQUIRE(load.size() == 2);
  CHECK(load[0].block == 1);
  CHECK(load[1].block == 3);
  CHECK(load[1].tokens.size() == 4);
  for (const parallel::ExpertLoad& l : load) {
    CHECK(l.passes == 2);
    CHECK(std::accumulate(l.tokens.begin(), l.tokens.end(), int64_t{0}) == 2 * 32 * 2);  // top-2
    CHECK(l.aux_loss > 0);
  }
  CHECK(model.take_expert_load().empty());
}

TEST_CASE("an MoE GPT learns, its gates included", "[gpt][moe]") {
  for (int k : {1, 2}) {
    DYNAMIC_SECTION("top-" << k) {
      Gpt model(moe_config(k), 7);
      optim::Adam opt({{model.named_parameters(), 3e-2, 0.0}}, optim::AdamOptions{});
      const Tensor ids = random_ids(4, 16, 8), targets = random_ids(4, 16, 9);
      Tensor gate_weight;
      for (const NamedParameter& p : model.named_parameters()) {
        if (p.name == "transformer.h.1.mlp.gate.weight") gate_weight = p.tensor;
      }
      REQUIRE(gate_weight.defined());
      const std::vector<float> gate_before = gate_weight.to_vector<float>();
      double first = 0, last = 0;
      for (int step = 0; step < 30; ++step) {
        opt.zero_grad();
        const Tensor loss = model.loss(model.forward(ids), targets);
        backward(loss);
        opt.step();
        (step == 0 ? first : last) = loss.item<double>();
      }
      CHECK(last < 0.5 * first);
      CHECK(gate_weight.to_vector<float>() != gate_before);
    }
  }
}

TEST_CASE("cached generation through MoE blocks equals the full forward", "[gpt][moe]") {
  // Enough evaluation capacity that the full forward drops no token either (one token at a
  // time never fills an expert).
  GptConfig cfg = moe_config(1);
  cfg.moe->gate.eval_capacity_factor = 4.0;
  Gpt model(cfg, 11);
  model.eval();
  const Tensor ids = random_ids(1, 9, 12);
  NoGradGuard no_grad;
  const std::vector<float> full = model.forward(ids).to_vector<float>();
  KvCache cache(model.config(), 1, 16);
  std::vector<float> stepped;
  for (int64_t t = 0; t < 9; ++t) {  // one token at a time, as generation routes
    const std::vector<float> l =
        model.forward_cached(narrow(ids, 1, t, 1).contiguous(), cache).to_vector<float>();
    stepped.insert(stepped.end(), l.begin(), l.end());
  }
  REQUIRE(stepped.size() == full.size());
  for (size_t i = 0; i < full.size(); ++i) CHECK(stepped[i] == Approx(full[i]).margin(1e-4));
}

TEST_CASE("an MoE GPT stage hands its aux term to the pipeline; slicing is refused", "[gpt][moe]") {
  const GptConfig cfg = moe_config();
  GptPart first_half;
  first_half.end_block = 2;
  first_half.final_norm = first_half.head = false;
  const Gpt stage(cfg, 1, nullptr, first_half);     // block 1 is an MoE block
  CHECK_FALSE(stage.stage_extra_loss().defined());  // nothing before a forward
  stage.forward_stage(random_ids(2, 8, 4));
  REQUIRE(stage.stage_extra_loss().defined());
  CHECK(stage.stage_extra_loss().item<double>() ==
        Approx(0.5 * stage.moe_outputs().at(0).l_aux.item<double>()));
  const Gpt whole(cfg, 1);  // the last stage's loss() adds its own blocks' term
  CHECK_FALSE(whole.stage_extra_loss().defined());

  std::vector<std::string> errors(2);
  parallel::run_thread_ranks(2, [&](parallel::Communicator& group) {
    try {
      const Gpt sliced(cfg, 1, &group);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(group.rank())] = e.what();
    }
  });
  for (const std::string& e : errors) CHECK_THAT(e, Catch::Contains("tensor-parallel"));
}

TEST_CASE("a checkpointed MoE GPT computes the same loss and gradients", "[gpt][moe]") {
  GptConfig cfg = moe_config(1);  // top-1 with random token selection and RSample noise
  cfg.moe->gate.use_rts = true;
  cfg.moe->gate.noisy_gate_policy = moe::NoisyGatePolicy::rsample;
  cfg.moe->gate.capacity_factor = 0.5;
  const Tensor ids = random_ids(2, 16, 5), targets = random_ids(2, 16, 6);
  std::vector<std::vector<float>> grads[2];
  double losses[2];
  for (int ckpt = 0; ckpt < 2; ++ckpt) {
    Gpt model(cfg, 3);
    model.set_activation_checkpointing(ckpt == 0 ? 0 : 2);  // segments of blocks 0-1, 2-3
    const Tensor loss = model.loss(model.forward(ids), targets);
    REQUIRE(model.moe_outputs().size() == 2);
    losses[ckpt] = loss.item<double>();
    backward(loss);
    for (const NamedParameter& p : model.named_parameters()) {
      grads[ckpt].push_back(p.tensor.grad().to_vector<float>());
    }
  }
  CHECK(losses[1] == losses[0]);
  REQUIRE(grads[1].size() == grads[0].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    INFO("parameter " << i);
    CHECK(grads[1][i] == grads[0][i]);
  }
}

}  // namespace
}  // namespace tessera
