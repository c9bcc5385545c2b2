#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"

namespace tessera::kernels::cpu {
namespace {

// Note [Causal attention on the CPU]
// Threads take whole (batch, head) pairs. Within one, queries and keys go in blocks of
// kBlock rows, and every product is a small GEMM over a block pair: S = scale Q_i K_j^T
// for the key blocks j at or before query block i (the diagonal block masks its upper
// triangle). The forward keeps a running max and sum per query row (online softmax, so no
// (T, T) matrix exists); the backward recomputes P from lse, walks the key blocks outside
// and the query blocks inside, and accumulates dK_j and dV_j in scratch and dQ_i in place:
//   dV_j += P^T dO_i,  dS = P * (dO_i V_j^T - rowdot(dO_i, O_i)),
//   dQ_i += scale dS K_j,  dK_j += scale dS^T Q_i.
// Row-at-a-time matrix-vector products did the same work 3-4x slower. q, k, v, dout and out
// are read through their strides (heads split out of a (B, T, 3C) projection need no
// copy), and out, dq, dk, dv are written in (B, T, H, D) memory order, so merging the heads
// back into (B, T, C) is a view.
constexpr int64_t kBlock = 64;

template <class T>
using StridedMap = Eigen::Map<const Matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using MutableStridedMap = Eigen::Map<Matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// A (B, H, T, D) tensor whose rows (the D values of one position) are unit-strided.
Tensor rows_unit_strided(const Tensor& x_in) {
  const Tensor x = x_in.detach();
  return x.size(3) <= 1 || x.stride(3) == 1 ? x : x.contiguous();
}

// An empty (B, H, T, D) tensor laid out as (B, T, H, D) in memory.
Tensor empty_heads_interleaved(const Tensor& like) {  // (B, H, T, D)
  return empty({like.size(0), like.size(2), like.size(1), like.size(3)},
               {like.dtype(), like.device()})
      .transpose(1, 2);
}

// The (T, D) matrix of head (b, h) of a (B, H, T, D) tensor with unit-strided rows.
template <class T>
class HeadView {
 public:
  explicit HeadView(Tensor x) : x_(std::move(x)), heads_(x_.size(1)) {}
  T* data(int64_t bh, int64_t row) const {
    return x_.data_ptr<T>() + (bh / heads_) * x_.stride(0) + (bh % heads_) * x_.stride(1) +
           row * x_.stride(2);
  }
  StridedMap<T> rows(int64_t bh, int64_t row, int64_t count) const {
    return StridedMap<T>(data(bh, row), count, x_.size(3), Eigen::OuterStride<>(x_.stride(2)));
  }
  MutableStridedMap<T> mutable_rows(int64_t bh, int64_t row, int64_t count) const {
    return MutableStridedMap<T>(data(bh, row), count, x_.size(3),
                                Eigen::OuterStride<>(x_.stride(2)));
  }

 private:
  Tensor x_;
  int64_t heads_;
};

// Zeroes the entries of a diagonal block above its diagonal (keys after the query).
template <class Block>
void mask_future(Block&& block, typename std::decay_t<Block>::Scalar value) {
  for (int64_t r = 0; r < block.rows(); ++r) {
    for (int64_t c = r + 1; c < block.cols(); ++c) block(r, c) = value;
  }
}

}  // namespace

AttentionOutput causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                 double scale) {
  const Tensor q = rows_unit_strided(q_in);  // (B, H, T, D)
  const Tensor k = rows_unit_strided(k_in);  // (B, H, T, D)
  const Tensor v = rows_unit_strided(v_in);  // (B, H, T, D)
  const int64_t heads = q.size(0) * q.size(1);
  const int64_t len = q.size(2);
  const int64_t dim = q.size(3);
  AttentionOutput result{empty_heads_interleaved(q),
                         empty({q.size(0), q.size(1), len}, {q.dtype(), q.device()})};
  dispatch_floating(q.dtype(), "causal_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(scale);
    const HeadView<T> Q(q), K(k), V(v), O(result.out);
    parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
      Matrix<T> scores(kBlock, kBlock), acc(kBlock, dim);
      ArrayX<T> row_max(kBlock), row_sum(kBlock), new_max(kBlock), rescale(kBlock);
      for (int64_t h = h0; h < h1; ++h) {
        T* lse = result.lse.data_ptr<T>() + h * len;
        for (int64_t r0 = 0; r0 < len; r0 += kBlock) {
          const int64_t rows = std::min(kBlock, len - r0);
          const auto Qi = Q.rows(h, r0, rows);
          auto Oi = acc.topRows(rows);
          Oi.setZero();
          row_max.head(rows).setConstant(-std::numeric_limits<T>::infinity());
          row_sum.head(rows).setZero();
          for (int64_t c0 = 0; c0 <= r0; c0 += kBlock) {
            const int64_t cols = std::min(kBlock, len - c0);
            auto S = scores.topLeftCorner(rows, cols);
            S.noalias() = s * (Qi * K.rows(h, c0, cols).transpose());
            if (c0 == r0) mask_future(S, -std::numeric_limits<T>::infinity());
            // Online softmax: rescale what earlier key blocks summed to the new row max.
            new_max.head(rows) = row_max.head(rows).max(S.array().rowwise().maxCoeff());
            rescale.head(rows) = (row_max.head(rows) - new_max.head(rows)).exp();
            row_max.head(rows) = new_max.head(rows);
            S.array().colwise() -= row_max.head(rows);
            S.array() = S.array().exp();
            row_sum.head(rows) =
                row_sum.head(rows) * rescale.head(rows) + S.array().rowwise().sum();
            Oi.array().colwise() *= rescale.head(rows);
            Oi.noalias() += S * V.rows(h, c0, cols);
          }
          O.mutable_rows(h, r0, rows) = (Oi.array().colwise() / row_sum.head(rows)).matrix();
          for (int64_t r = 0; r < rows; ++r) lse[r0 + r] = row_max[r] + std::log(row_sum[r]);
        }
      }
    });
  });
  return result;
}

AttentionGrads causal_attention_backward(const Tensor& dout_in, const Tensor& q_in,
                                         const Tensor& k_in, const Tensor& v_in,
                                         const Tensor& out_in, const Tensor& lse_in, double scale) {
  const Tensor dout = rows_unit_strided(dout_in);     // (B, H, T, D)
  const Tensor q = rows_unit_strided(q_in);           // (B, H, T, D)
  const Tensor k = rows_unit_strided(k_in);           // (B, H, T, D)
  const Tensor v = rows_unit_strided(v_in);           // (B, H, T, D)
  const Tensor out = rows_unit_strided(out_in);       // (B, H, T, D)
  const Tensor lse_t = lse_in.detach().contiguous();  // (B, H, T)
  const int64_t heads = q.size(0) * q.size(1);
  const int64_t len = q.size(2);
  const int64_t dim = q.size(3);
  AttentionGrads grads{empty_heads_interleaved(q), empty_heads_interleaved(q),
                       empty_heads_interleaved(q)};
  dispatch_floating(q.dtype(), "causal_attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(scale);
    const HeadView<T> Q(q), K(k), V(v), O(out), dO(dout);
    const HeadView<T> dQ(grads.dq), dK(grads.dk), dV(grads.dv);
    parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
      Matrix<T> prob(kBlock, kBlock), dscore(kBlock, kBlock), dk(kBlock, dim), dv(kBlock, dim);
      ArrayX<T> delta(len);
      for (int64_t h = h0; h < h1; ++h) {
        const T* lse = lse_t.data_ptr<T>() + h * len;
        // delta[t] = dout[t] . out[t], the rowsum(dP * P) of the softmax gradient.
        delta = (dO.rows(h, 0, len).array() * O.rows(h, 0, len).array()).rowwise().sum();
        dQ.mutable_rows(h, 0, len).setZero();
        for (int64_t c0 = 0; c0 < len; c0 += kBlock) {
          const int64_t cols = std::min(kBlock, len - c0);
          const auto Kj = K.rows(h, c0, cols);
          const auto Vj = V.rows(h, c0, cols);
          auto dKj = dk.topRows(cols);
          auto dVj = dv.topRows(cols);
          dKj.setZero();
          dVj.setZero();
          for (int64_t r0 = c0; r0 < len; r0 += kBlock) {
            const int64_t rows = std::min(kBlock, len - r0);
            const auto Qi = Q.rows(h, r0, rows);
            const auto dOi = dO.rows(h, r0, rows);
            auto P = prob.topLeftCorner(rows, cols);
            auto dS = dscore.topLeftCorner(rows, cols);
            P.noalias() = s * (Qi * Kj.transpose());
            const Eigen::Map<const ArrayX<T>> lse_i(lse + r0, rows);
            P.array() = (P.array().colwise() - lse_i).exp();
            if (c0 == r0) mask_future(P, T(0));
            dVj.noalias() += P.transpose() * dOi;
            dS.noalias() = dOi * Vj.transpose();
            dS.array() = P.array() * (dS.array().colwise() - delta.segment(r0, rows));
            dQ.mutable_rows(h, r0, rows).noalias() += s * (dS * Kj);
            dKj.noalias() += s * (dS.transpose() * Qi);
          }
          dK.mutable_rows(h, c0, cols) = dKj;
          dV.mutable_rows(h, c0, cols) = dVj;
        }
      }
    });
  });
  return grads;
}

}  // namespace tessera::kernels::cpu
