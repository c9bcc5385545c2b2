#include "models/gpt2/batch_split.h"

#include <algorithm>

#include "autograd/ops.h"
#include "core/error.h"

namespace tessera {

Tensor run_batch_split(const std::vector<BlockCall>& blocks, const Tensor& x, int64_t pieces) {
  TS_CHECK(pieces >= 1, "[gpt2] batch split: expected at least 1 piece, found ", pieces);
  TS_CHECK(x.dim() == 3, "[gpt2] batch split: expected activations (B, T, C), found ",
           shape_str(x.shape()));
  const int64_t batch = x.size(0), n = std::min(pieces, batch);
  if (blocks.empty() || batch == 0) return x;  // nothing to compute: (0, T, C) stays empty
  std::vector<int64_t> sizes;
  for (int64_t p = 0; p < n; ++p) sizes.push_back(batch / n + (p < batch % n ? 1 : 0));
  std::vector<Tensor> xs = split(x, sizes, 0);  // (B_p, T, C) each
  std::vector<parallel::PendingSum> pending(static_cast<size_t>(n));
  // Sub-layer s is block s / 2's attention (s even) or MLP (s odd).
  const auto finish = [&](size_t s, size_t p) {
    const BlockCall& call = blocks[s / 2];
    xs[p] = call.block->finish_sublayer(static_cast<int>(s % 2), xs[p], pending[p], call.divisor);
  };
  const size_t sublayers = 2 * blocks.size();
  for (size_t s = 0; s < sublayers; ++s) {
    for (size_t p = 0; p < xs.size(); ++p) {
      if (s > 0) finish(s - 1, p);
      pending[p] = blocks[s / 2].block->start_sublayer(static_cast<int>(s % 2), xs[p]);
    }
  }
  for (size_t p = 0; p < xs.size(); ++p) finish(sublayers - 1, p);
  return xs.size() == 1 ? xs[0] : cat(xs, 0);
}

}  // namespace tessera
