#include "models/gpt2/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/philox.h"

namespace tessera {

int32_t sample_token(const float* logits, int64_t vocab_size, const SamplingOptions& options,
                     double u) {
  std::vector<int32_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; ties by id so that the result does not depend on the sort.
  const auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (options.temperature == 0.0) return *std::min_element(order.begin(), order.end(), before);
  size_t keep = order.size();
  if (options.top_k > 0) keep = std::min(keep, static_cast<size_t>(options.top_k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    before);
  order.resize(keep);
  const double top = logits[order[0]];
  std::vector<double> prob(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    prob[i] = std::exp((logits[order[i]] - top) / options.temperature);
    total += prob[i];
  }
  if (options.top_p < 1.0) {
    // The smallest prefix whose probability reaches top_p (at least one token).
    double mass = 0.0;
    size_t n = 0;
    while (n < keep && mass < options.top_p * total) mass += prob[n++];
    keep = std::max<size_t>(n, 1);
    prob.resize(keep);
    total = std::accumulate(prob.begin(), prob.end(), 0.0);
  }
  double target = u * total;
  for (size_t i = 0; i < keep; ++i) {
    if (target < prob[i]) return order[i];
    target -= prob[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> sample(const Gpt& model, const std::vector<int32_t>& prompt,
                            int64_t max_new_tokens, const SamplingOptions& options,
                            const std::function<void(int32_t)>& on_token) {
  const GptConfig& cfg = model.config();
  TS_CHECK(!prompt.empty(), "[sample] expected a non-empty prompt");
  for (size_t i = 0; i < prompt.size(); ++i) {
    TS_CHECK(prompt[i] >= 0 && prompt[i] < cfg.vocab_size, "[sample] prompt token ", i, " is ",
             prompt[i], "; expected an id in [0, ", cfg.vocab_size, ")");
  }
  TS_CHECK(options.temperature >= 0.0 && options.top_p > 0.0 && options.top_p <= 1.0 &&
               options.top_k >= 0,
           "[sample] expected temperature >= 0, top_p in (0, 1], top_k >= 0; found ",
           options.temperature, ", ", options.top_p, ", ", options.top_k);
  NoGradGuard no_grad;
  std::vector<int32_t> context = prompt;
  std::vector<int32_t> out;
  // The model may live on a CUDA device and in 16 bits: ids go there, logits come back f32.
  const Tensor weight =
      model.named_parameters().front().tensor;  // a handle: the list is a temporary
  const Device device = weight.device();
  const DType dtype = weight.dtype();
  auto fresh_cache = [&] { return KvCache(cfg, 1, cfg.block_size, dtype, device); };
  KvCache cache = fresh_cache();
  // Feeds `ids` to the cache and returns the logits of the last position.
  auto feed = [&](const std::vector<int32_t>& ids) {
    const Tensor logits = model.forward_cached(
        from_vector(ids, {1, static_cast<int64_t>(ids.size())}).to(device), cache);  // (1, n, Vp)
    return logits.select(1, logits.size(1) - 1).to(Device::cpu()).to(DType::f32).contiguous();
  };
  const int64_t window = std::max<int64_t>(1, cfg.block_size / 2);
  const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - cfg.block_size);
  Tensor last = feed(std::vector<int32_t>(context.begin() + start, context.end()));
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const uint32_t bits = philox4x32(static_cast<uint64_t>(i), 0, options.seed)[0];
    const int32_t token =
        sample_token(last.data_ptr<float>(), cfg.vocab_size, options, uniform_from_bits(bits));
    out.push_back(token);
    context.push_back(token);
    if (on_token) on_token(token);
    if (i + 1 == max_new_tokens) break;
    if (cache.length == cfg.block_size) {
      cache = fresh_cache();
      last = feed(std::vector<int32_t>(context.end() - window, context.end()));
    } else {
      last = feed({token});
    }
  }
  return out;
}

}  // namespace tessera
