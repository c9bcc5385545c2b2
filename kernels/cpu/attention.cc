#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/small_gemm.h"
#include "kernels/cpu/widen.h"

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
// back into (B, T, C) is a view. Every product goes through block_product, its B operand
// with unit-strided rows (K_j^T and V_j^T are copied into scratch per key block, P^T
// and dS^T are read through strides). For f32 heads of up to 64 values the products go through
// small_gemm (Note [Small block products]), which skips the diagonal blocks' masked
// triangle; other dtypes and sizes use Eigen. With the row-wise exps below, GPT-2's twelve
// attention layers at B = 4, T = 64 took 3.4 ms forward and 8.5 ms backward on two Zen 4
// cores, against 7.0 and 20 ms with Eigen's products.
constexpr int64_t kBlock = 64;
static_assert(kBlock == kSmallCols);

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
  int64_t row_stride() const { return x_.stride(2); }

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

// block(r, :) = exp(block(r, :) - shift[r]) for each row. Row by row because a row of a
// row-major block is contiguous and Eigen vectorizes its exp; over the whole block with a
// column-wise shift Eigen called the scalar expf (15% of the attention's time at T = 64).
template <class Block, class Shift>
void exp_shifted_rows(Block&& block, const Shift& shift) {
  for (int64_t r = 0; r < block.rows(); ++r) {
    block.row(r).array() = (block.row(r).array() - shift[r]).exp();
  }
}

// The softmax gradient dS = P * (dP - delta[r]), row by row (as exp_shifted_rows).
template <class Block, class ConstBlock, class Delta>
void softmax_grad_rows(Block&& ds, const ConstBlock& p, const Delta& delta) {
  for (int64_t r = 0; r < ds.rows(); ++r) {
    ds.row(r).array() = p.row(r).array() * (ds.row(r).array() - delta[r]);
  }
}

// Note [Dropout in the CPU attention]
// With dropout (Note [Attention-probability dropout] in kernels/attention.h) each block
// pair makes its mask with dropout_keep_rows, the words of its rows' index ranges, and scales
// the probabilities it multiplies into v (forward) or dout (backward's dV) and the dP it
// turns into dS. The forward's row sums and lse stay undropped.
//
// The mask of the block of query rows [r0, r0 + rows) and key columns [c0, c0 + cols) of
// head `head` (b H + h): keep[r * kBlock + c] (a diagonal block's entries past its
// diagonal are made too, and unused).
void block_keep(const AttentionDropout& dropout, int64_t head, int64_t len, int64_t r0,
                int64_t rows, int64_t c0, int64_t cols, uint8_t* keep) {
  const uint64_t first = (static_cast<uint64_t>(head) * len + r0) * len + c0;
  dropout_keep_rows(dropout.seed, dropout.offset, first, len, rows, cols, dropout.p, keep, kBlock);
}

// block(r, c) = keep ? block(r, c) * scale : 0 over the entries block_keep set.
template <class Block>
void apply_keep(Block&& block, const uint8_t* keep, bool diagonal,
                typename std::decay_t<Block>::Scalar scale) {
  using T = typename std::decay_t<Block>::Scalar;
  static_assert(std::decay_t<Block>::IsRowMajor);
  for (int64_t r = 0; r < block.rows(); ++r) {
    const int64_t cols = diagonal ? std::min<int64_t>(block.cols(), r + 1) : block.cols();
    T* row = block.data() + r * block.outerStride();
    const uint8_t* row_keep = keep + r * kBlock;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] = row_keep[c] != 0 ? row[c] * scale : T(0);
  }
}

// Whether a head of `dim` values takes the small-block products.
template <class T>
bool small_blocks(int64_t dim) {
  return std::is_same_v<T, float> && kHaveSmallGemm && dim <= kSmallCols;
}

// dst (cols, rows), row-major with leading dimension kBlock, = src (rows, cols)^T: the B
// operand of a product with K^T or V^T.
template <class T>
void transpose_block(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * kBlock + r] = src[r * ld + c];
  }
}

// The k range and column count of the row groups of a block product (small_gemm). In a
// diagonal block (query block = key block) query row i sees keys j <= i only, so
// - products over keys (P V, dS K) stop at the group's last row: k < i + rows;
// - products into key columns (Q K^T, dO V^T) need columns j < i + rows;
// - products over queries into key rows (P^T dO, dS^T Q) start at the group's first key.
enum class Skip { kKeysUpTo, kKeyColumns, kQueriesFrom };

struct CausalBlock {
  bool diagonal;
  int64_t keys;     // key positions in the block (columns of S)
  int64_t queries;  // query positions (rows of S)

  // The k range of the row group [i, i + rows) of a product of k steps.
  std::pair<int64_t, int64_t> k_range(Skip skip, int64_t i, int64_t rows, int64_t k) const {
    if (!diagonal) return {0, k};
    if (skip == Skip::kKeysUpTo) return {0, std::min(k, i + rows)};
    if (skip == Skip::kQueriesFrom) return {i, k};
    return {0, k};
  }
  // The columns of the row group [i, i + rows) of a product with n columns.
  int64_t columns(Skip skip, int64_t i, int64_t rows, int64_t n) const {
    return diagonal && skip == Skip::kKeyColumns ? std::min(n, i + rows) : n;
  }
};

// c (m, n) = alpha a b, or += when accumulate: a (m, k) read through its row and column
// strides (one of them 1), b (k, n) with rows ldb apart, c with rows ldc apart. With small
// (small_blocks) the row groups skip what `skip` says a diagonal block does not need;
// Eigen computes the whole product, which has the same values where it matters: the
// skipped terms are zeros of a masked P or dS, and the skipped columns of S and dP are
// masked afterwards.
template <class T>
void block_product(bool small, const CausalBlock& block, Skip skip, const T* a,
                   int64_t a_row_stride, int64_t a_col_stride, int64_t m, int64_t k, const T* b,
                   int64_t ldb, int64_t n, T* c, int64_t ldc, T alpha, bool accumulate) {
  if (small) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      small_gemm(
          {a, a_row_stride, a_col_stride}, b, ldb, c, ldc, m, alpha, accumulate,
          [&](int64_t i, int64_t rows) { return block.k_range(skip, i, rows, k); },
          [&](int64_t i, int64_t rows) { return block.columns(skip, i, rows, n); });
      return;
    }
#endif
    TS_INTERNAL_ASSERT(false, "small block products need f32 and AVX-512");
  }
  using ColMajorMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>,
                                 Eigen::Unaligned, Eigen::OuterStride<>>;
  const StridedMap<T> B(b, k, n, Eigen::OuterStride<>(ldb));
  MutableStridedMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  const auto run = [&](const auto& A) {
    if (accumulate) {
      C.noalias() += alpha * (A * B);
    } else {
      C.noalias() = alpha * (A * B);
    }
  };
  if (a_col_stride == 1) {
    run(StridedMap<T>(a, m, k, Eigen::OuterStride<>(a_row_stride)));
  } else {
    run(ColMajorMap(a, m, k, Eigen::OuterStride<>(a_col_stride)));
  }
}

}  // namespace

AttentionOutput causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                 double scale, const AttentionDropout& dropout) {
  if (is_half(q_in.dtype())) {  // lse stays f32
    AttentionOutput o =
        cpu::causal_attention(widened(q_in), widened(k_in), widened(v_in), scale, dropout);
    o.out = narrowed(o.out, q_in.dtype());
    return o;
  }
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
    const bool drop = dropout.drops();
    const T drop_scale = static_cast<T>(1.0 / (1.0 - dropout.p));  // as kernels::dropout's
    const HeadView<T> Q(q), K(k), V(v), O(result.out);
    const bool small = small_blocks<T>(dim);
    parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
      Matrix<T> scores(kBlock, kBlock), acc(kBlock, dim), kt(dim, kBlock);
      ArrayX<T> row_max(kBlock), row_sum(kBlock), new_max(kBlock), rescale(kBlock);
      std::vector<uint8_t> keep(drop ? kBlock * kBlock : 0);
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
            const CausalBlock block{c0 == r0, cols, rows};
            auto S = scores.topLeftCorner(rows, cols);
            // S = s Q_i K_j^T; columns a diagonal block does not need may stay unset: masked.
            transpose_block(K.data(h, c0), K.row_stride(), cols, dim, kt.data());
            block_product(small, block, Skip::kKeyColumns, Qi.data(), Q.row_stride(), 1, rows, dim,
                          kt.data(), kBlock, cols, S.data(), kBlock, s, false);
            if (block.diagonal) mask_future(S, -std::numeric_limits<T>::infinity());
            // Online softmax: rescale what earlier key blocks summed to the new row max.
            new_max.head(rows) = row_max.head(rows).max(S.array().rowwise().maxCoeff());
            rescale.head(rows) = (row_max.head(rows) - new_max.head(rows)).exp();
            row_max.head(rows) = new_max.head(rows);
            exp_shifted_rows(S, row_max);
            row_sum.head(rows) =
                row_sum.head(rows) * rescale.head(rows) + S.array().rowwise().sum();
            for (int64_t r = 0; r < rows; ++r) Oi.row(r) *= rescale[r];
            if (drop) {  // Note [Dropout in the CPU attention]
              block_keep(dropout, h, len, r0, rows, c0, cols, keep.data());
              apply_keep(S, keep.data(), block.diagonal, drop_scale);
            }
            block_product(small, block, Skip::kKeysUpTo, S.data(), kBlock, 1, rows, cols,
                          V.data(h, c0), V.row_stride(), dim, Oi.data(), dim, T(1), true);
          }
          auto out_rows = O.mutable_rows(h, r0, rows);
          for (int64_t r = 0; r < rows; ++r) out_rows.row(r) = Oi.row(r) / row_sum[r];
          for (int64_t r = 0; r < rows; ++r) lse[r0 + r] = row_max[r] + std::log(row_sum[r]);
        }
      }
    });
  });
  return result;
}

AttentionGrads causal_attention_backward(const Tensor& dout_in, const Tensor& q_in,
                                         const Tensor& k_in, const Tensor& v_in,
                                         const Tensor& out_in, const Tensor& lse_in, double scale,
                                         const AttentionDropout& dropout) {
  if (is_half(q_in.dtype())) {
    const AttentionGrads g =
        cpu::causal_attention_backward(widened(dout_in), widened(q_in), widened(k_in),
                                       widened(v_in), widened(out_in), lse_in, scale, dropout);
    const DType d = q_in.dtype();
    return {narrowed(g.dq, d), narrowed(g.dk, d), narrowed(g.dv, d)};
  }
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
    const bool drop = dropout.drops();
    const T drop_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
    const HeadView<T> Q(q), K(k), V(v), O(out), dO(dout);
    const HeadView<T> dQ(grads.dq), dK(grads.dk), dV(grads.dv);
    const bool small = small_blocks<T>(dim);
    parallel_for(heads, 1, [&](int64_t h0, int64_t h1) {
      Matrix<T> prob(kBlock, kBlock), dscore(kBlock, kBlock), dk(kBlock, dim), dv(kBlock, dim);
      Matrix<T> dropped(drop ? kBlock : 0, drop ? kBlock : 0);  // P * M / (1 - p)
      std::vector<uint8_t> keep(drop ? kBlock * kBlock : 0);
      Matrix<T> kt(dim, kBlock), vt(dim, kBlock);
      ArrayX<T> delta(len);
      for (int64_t h = h0; h < h1; ++h) {
        const T* lse = lse_t.data_ptr<T>() + h * len;
        // delta[t] = dout[t] . out[t], the rowsum(dP * P) of the softmax gradient.
        delta = (dO.rows(h, 0, len).array() * O.rows(h, 0, len).array()).rowwise().sum();
        dQ.mutable_rows(h, 0, len).setZero();
        for (int64_t c0 = 0; c0 < len; c0 += kBlock) {
          const int64_t cols = std::min(kBlock, len - c0);
          auto dKj = dk.topRows(cols);
          auto dVj = dv.topRows(cols);
          dKj.setZero();
          dVj.setZero();
          transpose_block(K.data(h, c0), K.row_stride(), cols, dim, kt.data());
          transpose_block(V.data(h, c0), V.row_stride(), cols, dim, vt.data());
          for (int64_t r0 = c0; r0 < len; r0 += kBlock) {
            const int64_t rows = std::min(kBlock, len - r0);
            const CausalBlock block{c0 == r0, cols, rows};
            const T* q_i = Q.data(h, r0);
            const T* dout_i = dO.data(h, r0);
            auto P = prob.topLeftCorner(rows, cols);
            auto dS = dscore.topLeftCorner(rows, cols);
            // P and dS: columns a diagonal block does not need may stay unset: masked.
            block_product(small, block, Skip::kKeyColumns, q_i, Q.row_stride(), 1, rows, dim,
                          kt.data(), kBlock, cols, P.data(), kBlock, s, false);
            exp_shifted_rows(P, lse + r0);
            if (block.diagonal) mask_future(P, T(0));
            const T* p_used = P.data();  // what multiplied v: P, or P dropped out
            if (drop) {                  // Note [Dropout in the CPU attention]
              block_keep(dropout, h, len, r0, rows, c0, cols, keep.data());
              auto Pd = dropped.topLeftCorner(rows, cols);
              Pd = P;
              apply_keep(Pd, keep.data(), block.diagonal, drop_scale);
              p_used = Pd.data();
            }
            // dV_j += P^T dO_i: P^T read through P's strides.
            block_product(small, block, Skip::kQueriesFrom, p_used, 1, kBlock, cols, rows, dout_i,
                          dO.row_stride(), dim, dVj.data(), dim, T(1), true);
            block_product(small, block, Skip::kKeyColumns, dout_i, dO.row_stride(), 1, rows, dim,
                          vt.data(), kBlock, cols, dS.data(), kBlock, T(1), false);
            if (drop) apply_keep(dS, keep.data(), block.diagonal, drop_scale);
            softmax_grad_rows(dS, P, delta.data() + r0);
            if (block.diagonal) mask_future(dS, T(0));
            block_product(small, block, Skip::kKeysUpTo, dS.data(), kBlock, 1, rows, cols,
                          K.data(h, c0), K.row_stride(), dim, dQ.data(h, r0), dQ.row_stride(), s,
                          true);
            block_product(small, block, Skip::kQueriesFrom, dS.data(), 1, kBlock, cols, rows, q_i,
                          Q.row_stride(), dim, dKj.data(), dim, s, true);
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
