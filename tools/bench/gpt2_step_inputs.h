// What every GPT-2 step benchmark feeds its step: the same random tokens and targets, and
// the step's FLOPs by the formula MFU uses everywhere (models/model_spec.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/factories.h"
#include "core/philox.h"
#include "models/gpt2/config.h"
#include "models/model_spec.h"

namespace tessera::bench {

struct StepTokens {
  Tensor idx;      // (batch, seq) i32 token ids below the vocabulary size
  Tensor targets;  // (batch, seq) i32, the next-token targets
};

// Tokens and targets from Philox (key 1234), the same in every benchmark and framework run,
// on `device`.
inline StepTokens random_step_tokens(const GptConfig& cfg, int64_t batch, int64_t seq,
                                     Device device = Device::cpu()) {
  const int64_t n = batch * seq;
  std::vector<int32_t> ids(static_cast<size_t>(2 * n));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] =
        static_cast<int32_t>(philox4x32(i, 0, 1234)[0] % static_cast<uint32_t>(cfg.vocab_size));
  }
  return {from_vector(std::vector<int32_t>(ids.begin(), ids.begin() + n), {batch, seq}).to(device),
          from_vector(std::vector<int32_t>(ids.begin() + n, ids.end()), {batch, seq}).to(device)};
}

// Training FLOPs of one step of batch x seq tokens (PaLM appendix B: 6N + 12 L C T per
// token, N with the padded vocabulary).
inline double step_flops(const GptConfig& cfg, int64_t batch, int64_t seq) {
  return static_cast<double>(batch * seq) *
         transformer_flops_per_token(cfg.num_parameters(), cfg.n_layer, cfg.n_embd, cfg.n_head, seq,
                                     std::nullopt);
}

}  // namespace tessera::bench
