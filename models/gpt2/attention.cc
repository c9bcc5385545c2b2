#include "models/gpt2/attention.h"

#include <cmath>
#include <limits>

#include "autograd/ops.h"
#include "core/factories.h"

namespace tessera {

CausalSelfAttention::CausalSelfAttention(const GptConfig& cfg, parallel::DropoutStreams& streams,
                                         parallel::Communicator& model_group,
                                         parallel::AsyncCollectives* async)
    : n_head_(cfg.n_head / model_group.size()),
      c_attn_(cfg.n_embd, 3 * cfg.n_embd, cfg.bias, model_group, /*gather_output=*/false,
              /*parts=*/3, DType::f32, async),
      attn_dropout_(cfg.attention_probs_dropout(), streams.sliced()),
      c_proj_(cfg.n_embd, cfg.n_embd, cfg.bias, model_group, /*input_is_parallel=*/true, DType::f32,
              async),
      resid_dropout_(cfg.dropout, streams.replicated()) {
  if (cfg.sparse_attention) {
    // One layout for every block of this model part and every tensor-parallel rank: keyed
    // by the replicated stream's own key (a pipeline stage past the first has its own).
    sparse_ = std::make_unique<SparseSelfAttention>(
        *cfg.sparse_attention, n_head_, cfg.block_size,
        hash_name(streams.replicated().seed(), "sparse_attention"));
  }
  register_module("c_attn", c_attn_);
  register_module("attn_dropout", attn_dropout_);
  register_module("c_proj", c_proj_);
  register_module("resid_dropout", resid_dropout_);
}

std::vector<Tensor> CausalSelfAttention::heads(const Tensor& x) const {
  const int64_t b = x.size(0), t = x.size(1);
  const Tensor qkv = c_attn_(x);  // (B, T, 3 C_local): this rank's q, k, v
  const int64_t c = qkv.size(2) / 3;
  std::vector<Tensor> parts = split(qkv, {c, c, c}, 2);
  for (Tensor& p : parts) {
    // Views of qkv's memory: the attention kernels read rows through their strides.
    p = transpose(view(p, {b, t, n_head_, c / n_head_}), 1, 2);  // (B, H, T, D)
  }
  return parts;
}

Tensor CausalSelfAttention::merge_heads(const Tensor& y) const {
  const int64_t b = y.size(0), t = y.size(2);
  return reshape(transpose(y, 1, 2), {b, t, n_head_ * y.size(3)});
}

Tensor CausalSelfAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& visible) const {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor scores = matmul(q, transpose(k, 2, 3)) * scale;  // (B, H, T, S)
  if (visible.defined()) {
    scores = where(visible, scores, scalar_like(scores, -std::numeric_limits<double>::infinity()));
  }
  return matmul(attn_dropout_.forward(softmax(scores)), v);  // (B, H, T, D)
}

Tensor CausalSelfAttention::visible_keys(int64_t t, int64_t start, Device device) const {
  const int64_t total = start + t;
  const int64_t heads = sparse_ ? n_head_ : 1;
  std::vector<bool> mask(static_cast<size_t>(heads * t * total));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t s = 0; s < total; ++s) {
        mask[(h * t + i) * total + s] =
            s <= start + i && (!sparse_ || sparse_->visible(h, start + i, s));
      }
    }
  }
  return from_vector(mask, {heads, t, total}).to(device);
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  const ModuleScope scope(*this);  // Note [Forward observers]
  return resid_dropout_.forward(c_proj_(mixed(x)));
}

parallel::PendingSum CausalSelfAttention::start(const Tensor& x) const {
  const ModuleScope scope(*this);
  return c_proj_.start(mixed(x));
}

Tensor CausalSelfAttention::finish(const parallel::PendingSum& pending) const {
  const ModuleScope scope(*this);
  return resid_dropout_.forward(c_proj_.finish(pending));
}

Tensor CausalSelfAttention::mixed(const Tensor& x) const {
  const std::vector<Tensor> qkv = heads(x);
  if (sparse_) return merge_heads(sparse_->forward(qkv[0], qkv[1], qkv[2], /*causal=*/true));
  // Note [Attention dropout]
  return merge_heads(causal_attention(qkv[0], qkv[1], qkv[2], attn_dropout_.p(),
                                      attn_dropout_.generator(), attn_dropout_.is_training()));
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, Tensor& cache_k, Tensor& cache_v,
                                           int64_t start) const {
  const int64_t t = x.size(1);
  TS_CHECK(start + t <= cache_k.size(2), "[CausalSelfAttention] KV cache holds ", cache_k.size(2),
           " positions, found ", start + t, " needed");
  const std::vector<Tensor> qkv = heads(x);
  cache_k.narrow(2, start, t).copy_(qkv[1]);
  cache_v.narrow(2, start, t).copy_(qkv[2]);
  const int64_t total = start + t;
  const Tensor k = cache_k.narrow(2, 0, total);  // (B, H, S, D)
  const Tensor v = cache_v.narrow(2, 0, total);  // (B, H, S, D)
  // A single new row without a layout sees every cached key: no mask.
  const Tensor visible = t > 1 || sparse_ ? visible_keys(t, start, x.device()) : Tensor();
  return resid_dropout_.forward(c_proj_(merge_heads(attend(qkv[0], k, v, visible))));
}

}  // namespace tessera
