// CUDA entry points of every kernel family, with the signatures of the public
// kernels/<family>.h functions. Inputs are already validated and on one CUDA device.
//
// With the toolkit they are the kernels in kernels/cuda/*.cu (cuBLASLt for matmul); without
// it kernels/cuda/stub.cc defines them to throw "built without CUDA".
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/blas1.h"
#include "kernels/block_sparse.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/index.h"
#include "kernels/lamb.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "kernels/sgd.h"
#include "kernels/signs.h"
#include "kernels/softmax.h"

namespace tessera::kernels::cuda {

Tensor unary(UnaryOp op, const Tensor& x);
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor compare(CompareOp op, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim);
MaxResult max(const Tensor& x, int64_t dim, bool keepdim);

// `bias` (N), when defined, is added to every row of the result (linear's forward).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Tensor& bias);
LinearParamGrads linear_param_grads(const Tensor& g, const Tensor& x);  // (R, N), (R, K)
Tensor add_linear_param_grads(const Tensor& g, const Tensor& x, const Tensor& dweight,
                              bool with_bias);
LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
GeluInputGrads gelu_input_grads(const Tensor& g, const Tensor& weight, const Tensor& pre);

Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& dy, const Tensor& y);
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y);

LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
AddLayerNormOutput add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                  const Tensor& bias, double eps);
LayerNormGrads add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                                       const Tensor& weight, const Tensor& mean,
                                       const Tensor& rstd);
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd);

Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& grad, const Tensor& ids, int64_t num_embeddings);
void embedding_backward_add_(const Tensor& dweight, const Tensor& grad, const Tensor& ids);

Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
void index_add_(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
// (N, cols) with cols >= V: the padding columns are zeros.
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index, int64_t cols);

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);
Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed, uint64_t offset);
// A contiguous tensor of `shape`, floating `dtype`, on `device`, holding 1 where dropout(x,
// p, seed, offset) keeps element i of a contiguous x of that shape, else 0
// (kernels/cuda/dropout.cu).
Tensor dropout_keep_mask(const Shape& shape, DType dtype, Device device, double p, uint64_t seed,
                         uint64_t offset);

// cuDNN's fused attention where it takes the call (kernels/fused_attention.h), else
// Tessera's flash kernels. `dropout` as kernels/attention.h says (default: none).
AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 const AttentionDropout& dropout = {});
AttentionGrads causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         double scale, const AttentionDropout& dropout = {});
// Tessera's own flash attention (kernels/cuda/attention_forward.cu, attention_backward.cu).
AttentionOutput flash_causal_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                       double scale, const AttentionDropout& dropout = {});
AttentionGrads flash_causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const Tensor& out,
                                               const Tensor& lse, double scale,
                                               const AttentionDropout& dropout = {});
// cuDNN's fused attention (kernels/cuda/cudnn_attention.cu); nothing when cuDNN does not
// take the call. Operands as kernels/attention.h validates them: q, k, v, out, dout (B, H, T,
// D) of one dtype and device, lse (B, H, T) f32. out is (B, T, H, D) in memory and dq, dk, dv
// views of one (B, T, 3, H, D) buffer, each seen as (B, H, T, D).
std::optional<AttentionOutput> cudnn_causal_attention(const Tensor& q, const Tensor& k,
                                                      const Tensor& v, double scale,
                                                      const AttentionDropout& dropout = {});
std::optional<AttentionGrads> cudnn_causal_attention_backward(const Tensor& dout, const Tensor& q,
                                                              const Tensor& k, const Tensor& v,
                                                              const Tensor& out, const Tensor& lse,
                                                              double scale,
                                                              const AttentionDropout& dropout = {});

// Block-sparse attention (kernels/block_sparse.h); the layout's tables are on the device.
Tensor block_sparse_sdd(const Tensor& a, const Tensor& b, const BlockLayout& layout);
Tensor block_sparse_dsd(const Tensor& s, const Tensor& x, const BlockLayout& layout,
                        bool transpose_s);
Tensor block_sparse_softmax(const Tensor& x, const BlockLayout& layout,
                            const BlockSoftmaxOptions& options);
Tensor block_sparse_softmax_backward(const Tensor& y, const Tensor& dy, const BlockLayout& layout,
                                     double scale);

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p);
void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& p,
                const Tensor& grad_scale);
double lamb_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const LambParams& p);
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdParams& p);

double squared_norm(const Tensor& x);
void add_squared_norm(const Tensor& x, const Tensor& total);
Tensor clip_factor(const Tensor& squared_norm, double loss_scale, double max_norm,
                   bool overflow_skips);

Tensor pack_signs(const Tensor& x);
Tensor unpack_signs(const Tensor& bits, int64_t n, DType dtype);
void scale_(const Tensor& x, double factor);
void axpy_(const Tensor& y, const Tensor& x, double alpha);

}  // namespace tessera::kernels::cuda
