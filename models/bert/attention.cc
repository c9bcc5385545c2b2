#include "models/bert/attention.h"

#include <cmath>

#include "autograd/ops.h"

namespace tessera {
namespace {

// Builds the sparse layer after checking that its layout can serve an encoder.
std::unique_ptr<SparseSelfAttention> make_sparse(const BertConfig& cfg,
                                                 const SparsityConfig* sparse,
                                                 uint64_t layout_seed) {
  if (sparse == nullptr) return nullptr;
  // A unidirectional layout drops every block above the diagonal: positions would never
  // see later tokens, which defeats the masked-LM objective.
  TS_CHECK(!sparse->unidirectional,
           "[bert] sparse_attention.attention: BERT is bidirectional; expected "
           "\"bidirectional\", found \"unidirectional\"");
  return std::make_unique<SparseSelfAttention>(*sparse, cfg.n_head, cfg.block_size, layout_seed);
}

}  // namespace

BertSelfAttention::BertSelfAttention(const BertConfig& cfg, const SparsityConfig* sparse,
                                     uint64_t layout_seed)
    : n_head_(cfg.n_head),
      qkv_(cfg.n_embd, 3 * cfg.n_embd),
      sparse_(make_sparse(cfg, sparse, layout_seed)) {
  register_module("qkv", qkv_);
}

Tensor BertSelfAttention::forward(const Tensor& x) const {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const Tensor qkv = qkv_(x);  // (B, T, 3C)
  std::vector<Tensor> parts = split(qkv, {c, c, c}, 2);
  for (Tensor& p : parts) {
    p = transpose(view(contiguous(p), {b, t, n_head_, c / n_head_}), 1, 2);  // (B, H, T, D)
  }
  const Tensor &q = parts[0], &k = parts[1], &v = parts[2];
  Tensor y;  // (B, H, T, D)
  if (sparse_) {
    y = sparse_->forward(q, k, v, /*causal=*/false);
  } else {
    // The dense baseline materializes the (T, T) scores of each head.
    const double scale = 1.0 / std::sqrt(static_cast<double>(c / n_head_));
    const Tensor scores = matmul(q, transpose(k, 2, 3)) * scale;  // (B, H, T, T)
    y = matmul(softmax(scores), v);
  }
  return reshape(transpose(y, 1, 2), {b, t, c});  // (B, T, C)
}

}  // namespace tessera
