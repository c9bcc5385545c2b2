// Block-sparse self-attention (DeepSpeed's SparseSelfAttention): q, k, v in, attention
// output out, through the SDD -> block softmax -> DSD ops over a sparsity layout.
//
//   SparseSelfAttention attn(config, /*num_heads=*/12, /*max_seq_len=*/2048, /*seed=*/1337);
//   Tensor y = attn.forward(q, k, v, /*causal=*/true);  // (B, H, T, D) -> (B, H, T, D)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/tensor.h"
#include "kernels/block_sparse.h"
#include "models/sparse/sparsity_config.h"

namespace tessera {

// Note [Sparse attention layouts by length]
// As in DeepSpeed, one master layout is built at max_seq_len and a sequence of T positions
// uses its top-left (nb, nb) corner, nb = ceil(T / block): every length of one run sees
// the same pattern. The index tables of each (nb, device) are built once and kept by the
// layer (not in a class-wide cache as DeepSpeed's, which lets two configs collide).
//
// Note [Padding to the block]
// T that is not a multiple of the block is padded with zero rows at the end; the padded
// keys are masked out (a -inf key-padding entry), the padded queries are dropped from the
// output. So any T <= max_seq_len gives the same values as the unpadded attention.
class SparseSelfAttention {
 public:
  // The master layout of `config` for `num_heads` heads at `max_seq_len` (rounded up to
  // the block); `seed` draws the random blocks (identical on every rank that passes it).
  SparseSelfAttention(const SparsityConfig& config, int64_t num_heads, int64_t max_seq_len,
                      uint64_t seed);

  // softmax(q k^T / sqrt(D) over the layout's blocks) v. `causal` also hides keys after
  // each query inside the blocks (GPT; its layouts should be unidirectional). Optional
  // DeepSpeed masks: key_padding_mask (B, T), attn_mask (T, T), each in its mode.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                 const Tensor& key_padding_mask = {},
                 kernels::MaskMode key_padding_mode = kernels::MaskMode::add,
                 const Tensor& attn_mask = {},
                 kernels::MaskMode attn_mask_mode = kernels::MaskMode::mul) const;

  const SparsityConfig& config() const { return config_; }
  // (H, nb_max, nb_max) i64: the master layout.
  const Tensor& layout() const { return layout_; }
  // Whether query position `query` may see key position `key` through head `head`'s
  // layout (causality not included): the element mask of the blocks.
  bool visible(int64_t head, int64_t query, int64_t key) const;
  // The index tables for sequences of `seq_len` positions on `device` (built on first use).
  const kernels::BlockLayout& block_layout(int64_t seq_len, Device device) const;

 private:
  SparsityConfig config_;
  int64_t num_heads_;
  int64_t max_seq_len_;
  Tensor layout_;             // (H, nb_max, nb_max) i64 on the CPU
  mutable std::mutex mutex_;  // guards tables_ (ranks of one process may share a model)
  mutable std::map<std::pair<int64_t, std::string>, kernels::BlockLayout> tables_;
};

}  // namespace tessera
