// Validation and the device switch of causal attention.
#include "kernels/attention.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

// q is a floating (B, H, T, D) tensor; a `name` tensor matches its dtype, device and shape.
void check_like_q(const char* op, const Tensor& q, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  check_same_dtype(op, "q", q, name, t);
  check_same_device(op, "q", q, name, t);
  check_same_shape(op, "q", q, name, t);
}

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  check_defined(op, "q", q);
  check_floating(op, "q", q);
  TS_CHECK(q.dim() == 4, "[", op, "] expected q of shape (B, H, T, D), found ",
           shape_str(q.shape()));
  check_like_q(op, q, "k", k);
  check_like_q(op, q, "v", v);
  TS_CHECK(std::isfinite(scale), "[", op, "] expected a finite scale, found ", scale);
}

void check_dropout(const char* op, const AttentionDropout& dropout) {
  TS_CHECK(dropout.p >= 0.0 && dropout.p < 1.0, "[", op,
           "] expected a dropout probability in [0, 1), found ", dropout.p);
}

}  // namespace

AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 const AttentionDropout& dropout) {
  check_qkv("causal_attention", q, k, v, scale);
  check_dropout("causal_attention", dropout);
  if (q.device().is_cuda()) return cuda::causal_attention(q, k, v, scale, dropout);
  return cpu::causal_attention(q, k, v, scale, dropout);
}

AttentionGrads causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         double scale, const AttentionDropout& dropout) {
  constexpr const char* op = "causal_attention_backward";
  check_qkv(op, q, k, v, scale);
  check_dropout(op, dropout);
  check_like_q(op, q, "dout", dout);
  check_like_q(op, q, "out", out);
  check_defined(op, "lse", lse);
  check_stat_dtype(op, "q", q, "lse", lse);
  check_same_device(op, "q", q, "lse", lse);
  check_shape(op, "lse", lse, {q.size(0), q.size(1), q.size(2)});
  if (q.device().is_cuda()) {
    return cuda::causal_attention_backward(dout, q, k, v, out, lse, scale, dropout);
  }
  return cpu::causal_attention_backward(dout, q, k, v, out, lse, scale, dropout);
}

}  // namespace tessera::kernels
