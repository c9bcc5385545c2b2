// Tiny GPT-2 models for tests: one for sampling, one for multi-rank training.
#pragma once

#include <memory>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/gpt2/gpt.h"

namespace tessera::testing {

// 2 layers, 2 heads, width 16, block 16.
inline GptConfig tiny_gpt_config(int64_t vocab_size) {
  GptConfig c;
  c.vocab_size = vocab_size;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

// 1 layer, 2 heads, width 16, block 6, vocabulary 23, no biases (the key bias only gets
// rounding noise): the model of the GPU multi-rank and multi-thread tests.
inline GptConfig one_layer_gpt_config() {
  GptConfig c;
  c.vocab_size = 23;
  c.block_size = 6;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.bias = false;
  return c;
}

// A model in eval mode whose matrices are scaled up 25x, so that its logits are far apart:
// samples are not near-uniform, and greedy choices do not hinge on rounding differences
// (e.g. between a cached and a full forward).
inline std::unique_ptr<Gpt> spread_gpt(const GptConfig& cfg, uint64_t seed) {
  auto model = std::make_unique<Gpt>(cfg, seed);
  NoGradGuard no_grad;
  for (const NamedParameter& p : model->named_parameters()) {
    if (p.tensor.dim() != 2) continue;
    std::vector<float> v = p.tensor.detach().to_vector<float>();
    for (float& x : v) x *= 25.0f;
    p.tensor.copy_(from_vector(v, p.tensor.shape()));
  }
  model->eval();
  return model;
}

}  // namespace tessera::testing
