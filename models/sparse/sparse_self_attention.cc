#include "models/sparse/sparse_self_attention.h"

#include <cmath>
#include <limits>

#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// `mask` (rows, cols) grown to (rows + pad_rows, cols + pad_cols) with `fill`.
Tensor pad_mask(const Tensor& mask, int64_t pad_rows, int64_t pad_cols, double fill) {
  const int64_t rows = mask.size(0), cols = mask.size(1);
  Tensor out = full({rows + pad_rows, cols + pad_cols}, fill, {mask.dtype(), mask.device()});
  out.narrow(0, 0, rows).narrow(1, 0, cols).copy_(mask);
  return out;
}

}  // namespace

SparseSelfAttention::SparseSelfAttention(const SparsityConfig& config, int64_t num_heads,
                                         int64_t max_seq_len, uint64_t seed)
    : config_(config),
      num_heads_(num_heads),
      max_seq_len_(round_up(max_seq_len, config.block)),
      layout_(make_sparsity_layout(config, num_heads, max_seq_len_, seed)) {
  TS_CHECK(num_heads > 0 && max_seq_len > 0,
           "[sparse_attention] expected num_heads and max_seq_len > 0, found ", num_heads, " and ",
           max_seq_len);
}

bool SparseSelfAttention::visible(int64_t head, int64_t query, int64_t key) const {
  const int64_t b = config_.block;
  const int64_t nb = layout_.size(1);
  return layout_.data_ptr<int64_t>()[(head * nb + query / b) * nb + key / b] != 0;
}

const kernels::BlockLayout& SparseSelfAttention::block_layout(int64_t seq_len,
                                                              Device device) const {
  TS_CHECK(seq_len % config_.block == 0 && seq_len > 0 && seq_len <= max_seq_len_,
           "[sparse_attention] expected a padded length that is a multiple of the block (",
           config_.block, ") in [", config_.block, ", ", max_seq_len_, "], found ", seq_len);
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_pair(seq_len, device.str());
  auto it = tables_.find(key);
  if (it == tables_.end()) {
    const int64_t nb = seq_len / config_.block;
    const Tensor corner = layout_.narrow(1, 0, nb).narrow(2, 0, nb);  // Note [Sparse ...]
    it = tables_.emplace(key, kernels::make_block_layout(corner, config_.block, device)).first;
  }
  return it->second;
}

Tensor SparseSelfAttention::forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    bool causal, const Tensor& key_padding_mask,
                                    kernels::MaskMode key_padding_mode, const Tensor& attn_mask,
                                    kernels::MaskMode attn_mask_mode) const {
  TS_CHECK(q_in.dim() == 4 && q_in.size(1) == num_heads_,
           "[sparse_attention] expected q of shape (B, ", num_heads_, ", T, D), found ",
           shape_str(q_in.shape()));
  const int64_t batch = q_in.size(0), len = q_in.size(2);
  TS_CHECK(len <= max_seq_len_, "[sparse_attention] sequence of ", len,
           " positions exceeds the layout's max_seq_len ", max_seq_len_);
  const int64_t padded = round_up(len, config_.block);
  const int64_t pad = padded - len;
  Tensor q = q_in, k = k_in, v = v_in;
  kernels::BlockSoftmaxOptions options;
  options.scale = 1.0 / std::sqrt(static_cast<double>(q_in.size(3)));
  options.causal = causal;
  options.key_padding_mode = key_padding_mode;
  options.attn_mask_mode = attn_mask_mode;
  options.key_padding_mask = key_padding_mask;
  options.attn_mask = attn_mask;
  if (pad > 0) {
    // Note [Padding to the block]: zero rows at the end, their keys masked out.
    const Tensor zero =
        zeros({batch, num_heads_, pad, q_in.size(3)}, {q_in.dtype(), q_in.device()});
    q = cat({q_in, zero}, 2);
    k = cat({k_in, zero}, 2);
    v = cat({v_in, zero}, 2);
    NoGradGuard no_grad;
    const TensorOptions mask_options{q_in.dtype(), q_in.device()};
    const double inf = std::numeric_limits<double>::infinity();
    if (key_padding_mask.defined()) {
      const bool mul = key_padding_mode == kernels::MaskMode::mul;
      options.key_padding_mask = pad_mask(key_padding_mask, 0, pad, mul ? 0.0 : -inf);
    } else {
      options.key_padding_mode = kernels::MaskMode::add;
      options.key_padding_mask = pad_mask(zeros({batch, len}, mask_options), 0, pad, -inf);
    }
    // The padded keys are hidden by the key padding; padded queries are dropped.
    if (attn_mask.defined()) options.attn_mask = pad_mask(attn_mask, pad, pad, 0.0);
  }
  const kernels::BlockLayout& layout = block_layout(padded, q_in.device());
  const Tensor scores = sdd_matmul(q, k, layout);                // (B, nnz, b, b)
  const Tensor probs = sparse_softmax(scores, layout, options);  // (B, nnz, b, b)
  const Tensor out = dsd_matmul(probs, v, layout);               // (B, H, T_padded, D)
  return pad > 0 ? narrow(out, 2, 0, len) : out;
}

}  // namespace tessera
