// The CUDA entry points of a build without the toolkit (--config=cpu or no nvcc): each
// throws a clear error (see kernels/cuda/kernels.h).
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {
[[noreturn]] void missing(const char* op) {
  TS_FAIL("[", op, "] cannot run on a CUDA tensor: Tessera was built without CUDA");
}
}  // namespace

Tensor unary(UnaryOp op, const Tensor&) { missing(unary_name(op)); }
Tensor unary_backward(UnaryOp op, const Tensor&, const Tensor&, const Tensor&) {
  missing(unary_name(op));
}
Tensor binary(BinaryOp op, const Tensor&, const Tensor&) { missing(binary_name(op)); }
Tensor compare(CompareOp op, const Tensor&, const Tensor&) { missing(compare_name(op)); }
Tensor where(const Tensor&, const Tensor&, const Tensor&) { missing("where"); }
Tensor sum(const Tensor&, const std::vector<int64_t>&, bool) { missing("sum"); }
Tensor var(const Tensor&, const std::vector<int64_t>&, int64_t, bool) { missing("var"); }
MaxResult max(const Tensor&, int64_t, bool) { missing("max"); }
Tensor matmul(const Tensor&, const Tensor&, bool, bool, const Tensor&) { missing("matmul"); }
LinearParamGrads linear_param_grads(const Tensor&, const Tensor&) { missing("linear_param_grads"); }
Tensor add_linear_param_grads(const Tensor&, const Tensor&, const Tensor&, bool) {
  missing("add_linear_param_grads");
}
LinearGelu linear_gelu(const Tensor&, const Tensor&, const Tensor&) { missing("linear_gelu"); }
GeluInputGrads gelu_input_grads(const Tensor&, const Tensor&, const Tensor&) {
  missing("gelu_input_grads");
}
Tensor softmax(const Tensor&) { missing("softmax"); }
Tensor log_softmax(const Tensor&) { missing("log_softmax"); }
Tensor softmax_backward(const Tensor&, const Tensor&) { missing("softmax_backward"); }
Tensor log_softmax_backward(const Tensor&, const Tensor&) { missing("log_softmax_backward"); }
LayerNormOutput layer_norm(const Tensor&, const Tensor&, const Tensor&, double) {
  missing("layer_norm");
}
AddLayerNormOutput add_layer_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  double) {
  missing("add_layer_norm");
}
LayerNormGrads add_layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&) {
  missing("add_layer_norm_backward");
}
LayerNormGrads layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&) {
  missing("layer_norm_backward");
}
Tensor embedding(const Tensor&, const Tensor&) { missing("embedding"); }
Tensor embedding_backward(const Tensor&, const Tensor&, int64_t) { missing("embedding_backward"); }
void embedding_backward_add_(const Tensor&, const Tensor&, const Tensor&) {
  missing("embedding_backward_add_");
}
Tensor cat(const std::vector<Tensor>&, int64_t) { missing("cat"); }
Tensor index_select(const Tensor&, int64_t, const Tensor&) { missing("index_select"); }
void index_add_(const Tensor&, int64_t, const Tensor&, const Tensor&) { missing("index_add_"); }
CrossEntropyOutput cross_entropy(const Tensor&, const Tensor&, int64_t) {
  missing("cross_entropy");
}
Tensor cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                              int64_t) {
  missing("cross_entropy_backward");
}
Tensor dropout(const Tensor&, double, uint64_t, uint64_t) { missing("dropout"); }
Tensor dropout_backward(const Tensor&, double, uint64_t, uint64_t) { missing("dropout_backward"); }
Tensor dropout_keep_mask(const Shape&, DType, Device, double, uint64_t, uint64_t) {
  missing("dropout_keep_mask");
}
AttentionOutput causal_attention(const Tensor&, const Tensor&, const Tensor&, double,
                                 const AttentionDropout&) {
  missing("causal_attention");
}
AttentionGrads causal_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, const Tensor&, double,
                                         const AttentionDropout&) {
  missing("causal_attention_backward");
}
AttentionOutput flash_causal_attention(const Tensor&, const Tensor&, const Tensor&, double,
                                       const AttentionDropout&) {
  missing("causal_attention");
}
AttentionGrads flash_causal_attention_backward(const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&, const Tensor&, double,
                                               const AttentionDropout&) {
  missing("causal_attention_backward");
}
std::optional<AttentionOutput> cudnn_causal_attention(const Tensor&, const Tensor&, const Tensor&,
                                                      double, const AttentionDropout&) {
  missing("causal_attention");
}
std::optional<AttentionGrads> cudnn_causal_attention_backward(const Tensor&, const Tensor&,
                                                              const Tensor&, const Tensor&,
                                                              const Tensor&, const Tensor&, double,
                                                              const AttentionDropout&) {
  missing("causal_attention_backward");
}
Tensor block_sparse_sdd(const Tensor&, const Tensor&, const BlockLayout&) {
  missing("block_sparse_sdd");
}
Tensor block_sparse_dsd(const Tensor&, const Tensor&, const BlockLayout&, bool) {
  missing("block_sparse_dsd");
}
Tensor block_sparse_softmax(const Tensor&, const BlockLayout&, const BlockSoftmaxOptions&) {
  missing("block_sparse_softmax");
}
Tensor block_sparse_softmax_backward(const Tensor&, const Tensor&, const BlockLayout&, double) {
  missing("block_sparse_softmax_backward");
}
void adamw_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AdamWParams&) {
  missing("adamw_step");
}
void adamw_step(const std::vector<AdamWTensors>&, const AdamWParams&, const Tensor&) {
  missing("adamw_step");
}
double lamb_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const LambParams&) {
  missing("lamb_step");
}
void sgd_step(const Tensor&, const Tensor&, const Tensor&, const SgdParams&) {
  missing("sgd_step");
}
double squared_norm(const Tensor&) { missing("squared_norm"); }
void add_squared_norm(const Tensor&, const Tensor&) { missing("add_squared_norm"); }
Tensor clip_factor(const Tensor&, double, double, bool) { missing("clip_factor"); }
Tensor pack_signs(const Tensor&) { missing("pack_signs"); }
Tensor unpack_signs(const Tensor&, int64_t, DType) { missing("unpack_signs"); }
void scale_(const Tensor&, double) { missing("scale_"); }
void axpy_(const Tensor&, const Tensor&, double) { missing("axpy_"); }

}  // namespace tessera::kernels::cuda
