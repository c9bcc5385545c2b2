#include "models/bert/masking.h"

#include <array>
#include <vector>

#include "core/error.h"
#include "core/factories.h"
#include "core/philox.h"

namespace tessera {

MaskedBatch mask_tokens(const Tensor& tokens, const BertConfig& cfg, uint64_t seed,
                        uint64_t counter) {
  TS_CHECK(tokens.dim() == 2, "[bert] mask_tokens: expected tokens of shape (B, T), found ",
           shape_str(tokens.shape()));
  TS_CHECK(!is_floating(tokens.dtype()) && tokens.dtype() != DType::boolean,
           "[bert] mask_tokens: expected integer token ids, found dtype ",
           dtype_name(tokens.dtype()));
  std::vector<int64_t> inputs = tokens.to_vector<int64_t>();
  std::vector<int64_t> targets(inputs.size(), kMlmIgnoreIndex);
  const int64_t vocab = cfg.vocab_size;
  const uint64_t key = hash_name(seed, "bert.mlm_masking");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t token = inputs[i];
    TS_CHECK(token >= 0 && token < vocab, "[bert] mask_tokens: expected token ids in [0, ", vocab,
             "), found ", token, " at flat position ", i);
    const std::array<uint32_t, 4> w = philox4x32(i, counter, key);
    // Doubles compare the exact 24-bit uniforms: the same decision on every machine.
    if (static_cast<double>(uniform_from_bits(w[0])) >= cfg.mask_prob) continue;
    targets[i] = token;
    const double action = uniform_from_bits(w[1]);
    if (action < 0.8) {
      inputs[i] = cfg.mask_token_id();
    } else if (action < 0.9) {
      // 64 random bits modulo V: the bias is below V / 2^64, negligible.
      const uint64_t bits = (static_cast<uint64_t>(w[2]) << 32) | w[3];
      inputs[i] = static_cast<int64_t>(bits % static_cast<uint64_t>(vocab));
    }  // else: the input keeps the original token
  }
  const Shape shape = tokens.shape();
  return {from_vector(inputs, shape), from_vector(targets, shape)};
}

}  // namespace tessera
