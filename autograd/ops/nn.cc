// Neural-network ops: forward and backward side by side, on fused kernels.
#include "autograd/ops/nn.h"

#include <cmath>

#include "autograd/record.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/embedding.h"
#include "kernels/layer_norm.h"
#include "kernels/softmax.h"

namespace tessera {

Tensor softmax(const Tensor& x) {
  Tensor y = kernels::softmax(x);
  record_function("softmax", {x}, {&y}, [y = y.detach()](const TensorList& g) {
    return TensorList{kernels::softmax_backward(g[0], y)};
  });
  return y;
}

Tensor log_softmax(const Tensor& x) {
  Tensor y = kernels::log_softmax(x);
  record_function("log_softmax", {x}, {&y}, [y = y.detach()](const TensorList& g) {
    return TensorList{kernels::log_softmax_backward(g[0], y)};
  });
  return y;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  kernels::LayerNormOutput r = kernels::layer_norm(x, weight, bias, eps);
  record_function("layer_norm", {x, weight, bias}, {&r.y},
                  [x = x.detach(), w = weight.defined() ? weight.detach() : Tensor(), mean = r.mean,
                   rstd = r.rstd](const TensorList& g) {
                    kernels::LayerNormGrads d =
                        kernels::layer_norm_backward(g[0], x, w, mean, rstd);
                    return TensorList{d.dx, d.dweight, d.dbias};
                  });
  return r.y;
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                         const Tensor& bias, double eps) {
  kernels::AddLayerNormOutput r = kernels::add_layer_norm(x, delta, weight, bias, eps);
  Tensor h = r.h, y = r.norm.y;
  record_function("add_layer_norm", {x, delta, weight, bias}, {&h, &y},
                  [h = r.h.detach(), w = weight.defined() ? weight.detach() : Tensor(),
                   mean = r.norm.mean, rstd = r.norm.rstd](const TensorList& g) {
                    // g: h's gradient from its other uses, then y's.
                    kernels::LayerNormGrads d =
                        kernels::add_layer_norm_backward(g[1], g[0], h, w, mean, rstd);
                    return TensorList{d.dx, d.dx, d.dweight, d.dbias};
                  });
  return {h, y};
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Tensor out = kernels::embedding(weight, ids);
  // The rows of this lookup are added into the weight's gradient where it already sums
  // one that nothing else holds (the tied head's), or into the weight's own gradient buffer
  // (Notes [Gradients added in place] and [Gradients accumulated into leaves]).
  record_function(
      "embedding", {weight}, {&out},
      [ids = ids.detach(), rows = weight.size(0)](const TensorList& g,
                                                  const std::vector<GradSlot*>& slots) {
        if (slots[0] == nullptr) return;
        if (Tensor* sum = slots[0]->in_place({rows, g[0].size(-1)}, g[0].dtype(), g[0].device())) {
          kernels::embedding_backward_add_(*sum, g[0], ids);
        } else {
          slots[0]->add(kernels::embedding_backward(g[0], ids, rows));
        }
      });
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                     int64_t classes) {
  const int64_t cols = logits.dim() == 2 ? logits.size(1) : 0;
  if (classes < 0) classes = cols;
  TS_CHECK(logits.dim() != 2 || (classes >= 1 && classes <= cols),
           "[cross_entropy] expected classes in [1, ", cols, "] for logits of shape ",
           shape_str(logits.shape()), ", found ", classes);
  // The kernels read the first `classes` columns in place through the row stride.
  const Tensor real = classes < cols ? logits.detach().narrow(1, 0, classes) : logits.detach();
  kernels::CrossEntropyOutput r = kernels::cross_entropy(real, targets, ignore_index);
  record_function(
      "cross_entropy", {logits}, {&r.loss},
      [real, targets = targets.detach(), lse = r.lse, ignore_index, cols](const TensorList& g) {
        return TensorList{
            kernels::cross_entropy_backward(g[0], real, targets, lse, ignore_index, cols)};
      });
  return r.loss;
}

Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  TS_CHECK(p >= 0.0 && p < 1.0, "[dropout] expected p in [0, 1), found ", p);
  if (!training || p == 0.0) return x;
  const uint64_t seed = gen.seed();
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(x.numel()));
  Tensor y = kernels::dropout(x, p, seed, offset);
  record_function("dropout", {x}, {&y}, [p, seed, offset](const TensorList& g) {
    return TensorList{kernels::dropout_backward(g[0], p, seed, offset)};
  });
  return y;
}

namespace {

// causal_attention with `dropout` (p = 0: none) and its backward.
Tensor record_causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                               const kernels::AttentionDropout& dropout) {
  if (scale <= 0.0) scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  kernels::AttentionOutput r = kernels::causal_attention(q, k, v, scale, dropout);
  record_function("causal_attention", {q, k, v}, {&r.out},
                  [q = q.detach(), k = k.detach(), v = v.detach(), out = r.out.detach(),
                   lse = r.lse, scale, dropout](const TensorList& g) {
                    kernels::AttentionGrads d =
                        kernels::causal_attention_backward(g[0], q, k, v, out, lse, scale, dropout);
                    return TensorList{d.dq, d.dk, d.dv};
                  });
  return r.out;
}

void check_heads(const Tensor& q) {
  TS_CHECK(q.dim() == 4, "[causal_attention] expected q of shape (B, H, T, D), found ",
           shape_str(q.shape()));
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  check_heads(q);
  return record_causal_attention(q, k, v, scale, {});
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double p, Generator& gen,
                        bool training, double scale) {
  check_heads(q);
  TS_CHECK(p >= 0.0 && p < 1.0,
           "[causal_attention] expected a dropout probability in [0, 1), found ", p);
  if (!training || p == 0.0) return record_causal_attention(q, k, v, scale, {});
  // The draw dropout() makes for the (B, H, T, T) probabilities.
  const uint64_t probabilities =
      static_cast<uint64_t>(q.size(0) * q.size(1) * q.size(2)) * static_cast<uint64_t>(q.size(2));
  const uint64_t seed = gen.seed();
  const uint64_t offset = gen.reserve(probabilities);
  return record_causal_attention(q, k, v, scale, {p, seed, offset});
}

}  // namespace tessera
