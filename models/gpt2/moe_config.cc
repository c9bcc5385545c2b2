#include "models/gpt2/moe_config.h"

#include "core/error.h"

namespace tessera {

int64_t GptMoeConfig::experts_at(int64_t layer) const {
  TS_CHECK(is_moe_block(layer), "[gpt2] block ", layer, " has a dense MLP, not experts");
  if (num_experts.size() == 1) return num_experts[0];
  return num_experts.at(static_cast<size_t>((layer + 1) / moe_every - 1));
}

void GptMoeConfig::validate(int64_t n_layer, const std::string& where) const {
  TS_CHECK(moe_every >= 1 && moe_every <= n_layer, where, "moe_every: expected 1 to n_layer (",
           n_layer, "), found ", moe_every);
  const int64_t blocks = moe_blocks(n_layer);
  TS_CHECK(num_experts.size() == 1 || static_cast<int64_t>(num_experts.size()) == blocks, where,
           "num_experts: expected one count or one per MoE block (", blocks, " with n_layer ",
           n_layer, " and moe_every ", moe_every, "), found ", num_experts.size());
  for (const int64_t n : num_experts) {
    TS_CHECK(n >= 1 && n <= 4096, where, "num_experts: expected counts of 1 to 4096, found ", n);
    moe::check_gate_config(gate, n, where.substr(0, where.size() - 1));
  }
  TS_CHECK(aux_loss_coef >= 0, where, "aux_loss_coef: expected a number >= 0, found ",
           aux_loss_coef);
  // Each rank of an expert-parallel group holds an equal share of every MoE block's experts.
  TS_CHECK(ep_size >= 1, where, "ep_size: expected an integer >= 1, found ", ep_size);
  for (const int64_t n : num_experts) {
    TS_CHECK(n % ep_size == 0, where, "ep_size: expected a divisor of every num_experts (", n,
             "), found ", ep_size);
  }
}

GptMoeConfig GptMoeConfig::from_json(JsonObjectReader moe) {
  GptMoeConfig c;
  if (const nlohmann::json* n = moe.raw("num_experts")) {
    const auto bad = [&] {
      TS_FAIL("[config] ", moe.key_path("num_experts"),
              ": expected a positive integer or an array of them, found ", n->dump());
    };
    c.num_experts.clear();
    if (n->is_number_integer()) {
      c.num_experts.push_back(n->get<int64_t>());
    } else if (n->is_array() && !n->empty()) {
      for (const nlohmann::json& v : *n) {
        if (!v.is_number_integer()) bad();
        c.num_experts.push_back(v.get<int64_t>());
      }
    } else {
      bad();
    }
  }
  c.moe_every = moe.get_in_range<int64_t>("moe_every", c.moe_every, 1, 1024);
  c.gate.k = static_cast<int>(moe.get_in_range<int64_t>("k", c.gate.k, 1, 2));
  c.gate.capacity_factor =
      moe.get_in_range<double>("capacity_factor", c.gate.capacity_factor, 1e-3, 1e3);
  c.gate.eval_capacity_factor =
      moe.get_in_range<double>("eval_capacity_factor", c.gate.eval_capacity_factor, 1e-3, 1e3);
  c.gate.min_capacity =
      moe.get_in_range<int64_t>("min_capacity", c.gate.min_capacity, 0, int64_t{1} << 30);
  c.gate.noisy_gate_policy = moe::parse_noisy_gate_policy(
      moe.get_one_of("noisy_gate_policy", "None", {"None", "Jitter", "RSample"}));
  c.gate.drop_tokens = moe.get<bool>("drop_tokens", c.gate.drop_tokens);
  c.gate.use_rts = moe.get<bool>("use_rts", c.gate.use_rts);
  c.gate.top2_2nd_expert_sampling =
      moe.get<bool>("top2_2nd_expert_sampling", c.gate.top2_2nd_expert_sampling);
  c.use_residual = moe.get<bool>("use_residual", c.use_residual);
  c.aux_loss_coef = moe.get_in_range<double>("aux_loss_coef", c.aux_loss_coef, 0.0, 1e3);
  c.ep_size = moe.get_in_range<int64_t>("ep_size", c.ep_size, 1, 4096);
  return c;
}

nlohmann::json GptMoeConfig::to_json() const {
  return {{"num_experts", num_experts},
          {"moe_every", moe_every},
          {"k", gate.k},
          {"capacity_factor", gate.capacity_factor},
          {"eval_capacity_factor", gate.eval_capacity_factor},
          {"min_capacity", gate.min_capacity},
          {"noisy_gate_policy", moe::to_string(gate.noisy_gate_policy)},
          {"drop_tokens", gate.drop_tokens},
          {"use_rts", gate.use_rts},
          {"top2_2nd_expert_sampling", gate.top2_2nd_expert_sampling},
          {"use_residual", use_residual},
          {"aux_loss_coef", aux_loss_coef},
          {"ep_size", ep_size}};
}

}  // namespace tessera
