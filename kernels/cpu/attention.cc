#include "kernels/cpu/attention.h"

#include <cmath>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"

namespace tessera::kernels::cpu {
namespace {

// Note [Causal attention on the CPU]
// Threads take whole (batch, head) pairs. Within one, query row t scores the keys s <= t
// into a per-thread row buffer of length T (the only scratch: no (T, T) matrix), turns
// them into probabilities with the row's max, and mixes the values; K and V of one head
// stay in cache across rows. Backward recomputes each probability row from lse and
// accumulates dk and dv of the head in place, which no other thread touches.

template <class T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;

}  // namespace

AttentionOutput causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                 double scale) {
  const Tensor q = q_in.detach().contiguous();  // (B, H, T, D)
  const Tensor k = k_in.detach().contiguous();  // (B, H, T, D)
  const Tensor v = v_in.detach().contiguous();  // (B, H, T, D)
  const int64_t heads = q.size(0) * q.size(1);
  const int64_t len = q.size(2);
  const int64_t dim = q.size(3);
  const TensorOptions options{q.dtype(), q.device()};
  AttentionOutput result{empty(q.shape(), options), empty({q.size(0), q.size(1), len}, options)};
  dispatch_floating(q.dtype(), "causal_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(scale);
    parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
      Vector<T> scores(len);
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t at = h * len * dim;
        const ConstMatrixMap<T> Q(q.data_ptr<T>() + at, len, dim);
        const ConstMatrixMap<T> K(k.data_ptr<T>() + at, len, dim);
        const ConstMatrixMap<T> V(v.data_ptr<T>() + at, len, dim);
        MatrixMap<T> O(result.out.data_ptr<T>() + at, len, dim);
        T* lse = result.lse.data_ptr<T>() + h * len;
        for (int64_t t = 0; t < len; ++t) {
          auto p = scores.head(t + 1);
          p.noalias() = s * (K.topRows(t + 1) * Q.row(t).transpose());
          const T max = p.maxCoeff();
          p = (p.array() - max).exp();
          const T sum = p.sum();
          O.row(t).noalias() = (1 / sum) * (p.transpose() * V.topRows(t + 1));
          lse[t] = max + std::log(sum);
        }
      }
    });
  });
  return result;
}

AttentionGrads causal_attention_backward(const Tensor& dout_in, const Tensor& q_in,
                                         const Tensor& k_in, const Tensor& v_in,
                                         const Tensor& out_in, const Tensor& lse_in, double scale) {
  const Tensor dout = dout_in.detach().contiguous();  // (B, H, T, D)
  const Tensor q = q_in.detach().contiguous();        // (B, H, T, D)
  const Tensor k = k_in.detach().contiguous();        // (B, H, T, D)
  const Tensor v = v_in.detach().contiguous();        // (B, H, T, D)
  const Tensor out = out_in.detach().contiguous();    // (B, H, T, D)
  const Tensor lse_t = lse_in.detach().contiguous();  // (B, H, T)
  const int64_t heads = q.size(0) * q.size(1);
  const int64_t len = q.size(2);
  const int64_t dim = q.size(3);
  const TensorOptions options{q.dtype(), q.device()};
  AttentionGrads grads{empty(q.shape(), options), empty(q.shape(), options),
                       empty(q.shape(), options)};
  dispatch_floating(q.dtype(), "causal_attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(scale);
    parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
      Vector<T> prob(len);
      Vector<T> dscore(len);
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t at = h * len * dim;
        const ConstMatrixMap<T> Q(q.data_ptr<T>() + at, len, dim);
        const ConstMatrixMap<T> K(k.data_ptr<T>() + at, len, dim);
        const ConstMatrixMap<T> V(v.data_ptr<T>() + at, len, dim);
        const ConstMatrixMap<T> O(out.data_ptr<T>() + at, len, dim);
        const ConstMatrixMap<T> dO(dout.data_ptr<T>() + at, len, dim);
        MatrixMap<T> dQ(grads.dq.data_ptr<T>() + at, len, dim);
        MatrixMap<T> dK(grads.dk.data_ptr<T>() + at, len, dim);
        MatrixMap<T> dV(grads.dv.data_ptr<T>() + at, len, dim);
        const T* lse = lse_t.data_ptr<T>() + h * len;
        dK.setZero();
        dV.setZero();
        for (int64_t t = 0; t < len; ++t) {
          const int64_t n = t + 1;
          auto p = prob.head(n);
          auto ds = dscore.head(n);
          p.noalias() = s * (K.topRows(n) * Q.row(t).transpose());
          p = (p.array() - lse[t]).exp();
          dV.topRows(n).noalias() += p * dO.row(t);
          // dp[s] = dout[t] . v[s]; ds = p * (dp - dout[t] . out[t]).
          ds.noalias() = V.topRows(n) * dO.row(t).transpose();
          ds = p.array() * (ds.array() - dO.row(t).dot(O.row(t)));
          dQ.row(t).noalias() = s * (ds.transpose() * K.topRows(n));
          dK.topRows(n).noalias() += s * (ds * Q.row(t));
        }
      }
    });
  });
  return grads;
}

}  // namespace tessera::kernels::cpu
