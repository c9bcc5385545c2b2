// Autoregressive sampling from a Gpt with a KV cache: each new token costs one position's
// forward pass, O(T) attention instead of re-running the whole O(T^2) context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/gpt2/gpt.h"
#include "models/sampling_options.h"

namespace tessera {

// Samples `max_new_tokens` tokens after `prompt` (non-empty ids < vocab_size) and returns
// them; `on_token` (optional) sees each as it is drawn. Only the first vocab_size logits are
// candidates, so vocabulary padding is never sampled. When the context reaches block_size,
// the cache is rebuilt from the last block_size / 2 tokens (a sliding window). Runs without
// recording gradients; call model.eval() first to turn dropout off.
std::vector<int32_t> sample(const Gpt& model, const std::vector<int32_t>& prompt,
                            int64_t max_new_tokens, const SamplingOptions& options,
                            const std::function<void(int32_t)>& on_token = {});

// One draw from `logits` (the first `vocab_size` entries of a row are used) under
// `options`, with uniform number `u` in [0, 1). Exposed for tests.
int32_t sample_token(const float* logits, int64_t vocab_size, const SamplingOptions& options,
                     double u);

}  // namespace tessera
