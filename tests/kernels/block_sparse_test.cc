// The block-sparse kernels against naive dense loops in f64: every kernel over a random
// layout with empty block rows and columns, masks in both modes, and the layout tables.
#include "kernels/block_sparse.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "core/factories.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;
using testing::require_close;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The problem: B=2, H=3, nb=5 blocks of 4 (T=20), D=6; a layout with about half its
// blocks, an empty block row in head 1 and an empty block column in head 2.
struct Problem {
  int64_t batch = 2, heads = 3, nb = 5, blk = 4, dim = 6;
  int64_t len() const { return nb * blk; }
  std::vector<int64_t> bits;  // (H, nb, nb)
  kernels::BlockLayout layout;
  Tensor q, k, v;  // (B, H, T, D) f64

  Problem() {
    Generator g(7);
    const std::vector<double> u = rand({heads * nb * nb}, g, {DType::f64}).to_vector<double>();
    for (int64_t e = 0; e < heads * nb * nb; ++e) {
      const int64_t h = e / (nb * nb), i = e / nb % nb, j = e % nb;
      bool on = u[e] < 0.5 || i == j;
      if (h == 1 && i == 3) on = false;
      if (h == 2 && j == 1) on = false;
      bits.push_back(on ? 1 : 0);
    }
    layout = kernels::make_block_layout(from_vector(bits, {heads, nb, nb}), blk, Device::cpu());
    q = randn({batch, heads, len(), dim}, g, {DType::f64});
    k = randn({batch, heads, len(), dim}, g, {DType::f64});
    v = randn({batch, heads, len(), dim}, g, {DType::f64});
  }
  bool on(int64_t h, int64_t qpos, int64_t kpos) const {
    return bits[(h * nb + qpos / blk) * nb + kpos / blk] != 0;
  }
  // Calls f(sparse index, dense index) for every entry of the layout's blocks: sparse in
  // (B, nnz, block, block), dense in (B, H, T, T).
  template <class F>
  void for_each_entry(F f) const {
    int64_t z = 0;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < nb; ++i) {
        for (int64_t j = 0; j < nb; ++j) {
          if (bits[(h * nb + i) * nb + j] == 0) continue;
          for (int64_t n = 0; n < batch; ++n) {
            for (int64_t r = 0; r < blk; ++r) {
              for (int64_t c = 0; c < blk; ++c) {
                f(((n * layout.nnz + z) * blk + r) * blk + c,
                  ((n * heads + h) * len() + i * blk + r) * len() + j * blk + c);
              }
            }
          }
          ++z;
        }
      }
    }
  }
  // The (B, H, T, T) dense matrix of a sparse tensor (0 outside the layout).
  std::vector<double> densify(const Tensor& s) const {
    const std::vector<double> sv = s.to_vector<double>();
    std::vector<double> d(batch * heads * len() * len(), 0.0);
    for_each_entry([&](int64_t sparse, int64_t dense) { d[dense] = sv[sparse]; });
    return d;
  }
  // The layout's entries of a dense (B, H, T, T) matrix, in the sparse order.
  std::vector<double> sparsify(const std::vector<double>& d) const {
    std::vector<double> s(batch * layout.nnz * blk * blk);
    for_each_entry([&](int64_t sparse, int64_t dense) { s[sparse] = d[dense]; });
    return s;
  }
};

// a b^T per head: (B, H, T, D) x2 -> (B, H, T, T).
std::vector<double> dense_nt(const Problem& p, const Tensor& a, const Tensor& b) {
  const std::vector<double> A = a.to_vector<double>(), B = b.to_vector<double>();
  const int64_t T = p.len(), D = p.dim;
  std::vector<double> out(p.batch * p.heads * T * T, 0.0);
  for (int64_t nh = 0; nh < p.batch * p.heads; ++nh) {
    for (int64_t x = 0; x < T; ++x) {
      for (int64_t y = 0; y < T; ++y) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += A[(nh * T + x) * D + d] * B[(nh * T + y) * D + d];
        out[(nh * T + x) * T + y] = acc;
      }
    }
  }
  return out;
}

// m x (or m^T x) per head: (B, H, T, T), (B, H, T, D) -> (B, H, T, D).
std::vector<double> dense_mm(const Problem& p, const std::vector<double>& m, const Tensor& x,
                             bool transpose) {
  const std::vector<double> X = x.to_vector<double>();
  const int64_t T = p.len(), D = p.dim;
  std::vector<double> out(p.batch * p.heads * T * D, 0.0);
  for (int64_t nh = 0; nh < p.batch * p.heads; ++nh) {
    for (int64_t r = 0; r < T; ++r) {
      for (int64_t c = 0; c < T; ++c) {
        const double w = transpose ? m[(nh * T + c) * T + r] : m[(nh * T + r) * T + c];
        for (int64_t d = 0; d < D; ++d) out[(nh * T + r) * D + d] += w * X[(nh * T + c) * D + d];
      }
    }
  }
  return out;
}

TEST_CASE("the layout tables list the nonzeros by row and by column", "[block_sparse]") {
  const Problem p;
  const std::vector<int32_t> row_start = p.layout.row_start.to_vector<int32_t>();
  const std::vector<int32_t> nz_col = p.layout.nz_col.to_vector<int32_t>();
  const std::vector<int32_t> nz_row = p.layout.nz_row.to_vector<int32_t>();
  const std::vector<int32_t> col_start = p.layout.col_start.to_vector<int32_t>();
  const std::vector<int32_t> col_nz = p.layout.col_nz.to_vector<int32_t>();
  int64_t z = 0;
  for (int64_t line = 0; line < p.heads * p.nb; ++line) {
    REQUIRE(row_start[line] == z);
    for (int64_t j = 0; j < p.nb; ++j) {
      if (p.bits[line * p.nb + j] == 0) continue;
      CHECK(nz_col[z] == j);
      CHECK(nz_row[z] == line);
      ++z;
    }
  }
  REQUIRE(p.layout.nnz == z);
  for (int64_t h = 0; h < p.heads; ++h) {
    for (int64_t j = 0; j < p.nb; ++j) {
      int64_t previous_row = -1;
      for (int32_t e = col_start[h * p.nb + j]; e < col_start[h * p.nb + j + 1]; ++e) {
        CHECK(nz_col[col_nz[e]] == j);
        CHECK(nz_row[col_nz[e]] / p.nb == h);
        CHECK(nz_row[col_nz[e]] > previous_row);
        previous_row = nz_row[col_nz[e]];
      }
    }
  }
  CHECK(col_start.back() == p.layout.nnz);
}

TEST_CASE("SDD computes exactly the layout's blocks of q k^T", "[block_sparse]") {
  const Problem p;
  const Tensor s = kernels::block_sparse_sdd(p.q, p.k, p.layout);
  REQUIRE(s.shape() == Shape{p.batch, p.layout.nnz, p.blk, p.blk});
  require_close(s, p.sparsify(dense_nt(p, p.q, p.k)), 1e-12);
  // Non-contiguous inputs give the same values.
  const Tensor kt = p.k.transpose(2, 3).contiguous().transpose(2, 3);
  require_close(kernels::block_sparse_sdd(p.q, kt, p.layout), s.to_vector<double>(), 1e-12);
}

TEST_CASE("DSD equals the dense product of the sparse matrix, plain and transposed",
          "[block_sparse]") {
  const Problem p;
  Generator g(11);
  const Tensor s = randn({p.batch, p.layout.nnz, p.blk, p.blk}, g, {DType::f64});
  const std::vector<double> dense = p.densify(s);
  require_close(kernels::block_sparse_dsd(s, p.v, p.layout, false), dense_mm(p, dense, p.v, false),
                1e-12);
  require_close(kernels::block_sparse_dsd(s, p.v, p.layout, true), dense_mm(p, dense, p.v, true),
                1e-12);
}

// The dense masked softmax of the scores `x` (sparse), row by row, 0 for empty rows.
std::vector<double> dense_softmax(const Problem& p, const Tensor& x, double scale, bool causal,
                                  const std::vector<double>& kp, bool kp_mul,
                                  const std::vector<double>& am, bool am_mul) {
  const std::vector<double> d = p.densify(x);
  const int64_t T = p.len();
  std::vector<double> y(d.size(), 0.0);
  for (int64_t n = 0; n < p.batch; ++n) {
    for (int64_t h = 0; h < p.heads; ++h) {
      for (int64_t r = 0; r < T; ++r) {
        const int64_t row = ((n * p.heads + h) * T + r) * T;
        std::vector<double> s(T, -kInf);
        double max = -kInf;
        for (int64_t c = 0; c < T; ++c) {
          if (!p.on(h, r, c) || (causal && c > r)) continue;
          double v = scale * d[row + c];
          if (!kp.empty()) v = kp_mul ? (kp[n * T + c] == 0 ? -kInf : v) : v + kp[n * T + c];
          if (!am.empty()) v = am_mul ? (am[r * T + c] == 0 ? -kInf : v) : v + am[r * T + c];
          s[c] = v;
          max = std::max(max, v);
        }
        if (max == -kInf) continue;
        double sum = 0;
        for (int64_t c = 0; c < T; ++c) sum += std::exp(s[c] - max);
        for (int64_t c = 0; c < T; ++c) y[row + c] = std::exp(s[c] - max) / sum;
      }
    }
  }
  return p.sparsify(y);
}

TEST_CASE("the block softmax equals the dense masked softmax", "[block_sparse]") {
  const Problem p;
  Generator g(13);
  const Tensor x = randn({p.batch, p.layout.nnz, p.blk, p.blk}, g, {DType::f64});
  const int64_t T = p.len();
  // Key padding hides the last 3 keys of batch 1 (mul: 0), or adds values (add).
  std::vector<double> kp_mul(p.batch * T, 1.0), kp_add(p.batch * T);
  for (int64_t c = T - 3; c < T; ++c) kp_mul[T + c] = 0.0;
  const std::vector<double> r = rand({p.batch * T}, g, {DType::f64}).to_vector<double>();
  for (size_t e = 0; e < kp_add.size(); ++e) kp_add[e] = r[e] - 0.5;
  std::vector<double> am_mul(T * T, 1.0), am_add(T * T, 0.0);
  for (int64_t q = 0; q < T; ++q) {
    am_mul[q * T + (q * 7) % T] = 0.0;  // one hidden key per query
    am_add[q * T + q] = 0.25;
  }
  const double scale = 0.3;
  for (const bool causal : {false, true}) {
    DYNAMIC_SECTION("causal " << causal) {
      kernels::BlockSoftmaxOptions o;
      o.scale = scale;
      o.causal = causal;
      require_close(kernels::block_sparse_softmax(x, p.layout, o),
                    dense_softmax(p, x, scale, causal, {}, false, {}, false), 1e-12);
      o.key_padding_mask = from_vector(kp_mul, {p.batch, T});
      o.key_padding_mode = kernels::MaskMode::mul;
      o.attn_mask = from_vector(am_add, {T, T});
      o.attn_mask_mode = kernels::MaskMode::add;
      require_close(kernels::block_sparse_softmax(x, p.layout, o),
                    dense_softmax(p, x, scale, causal, kp_mul, true, am_add, false), 1e-12);
      o.key_padding_mask = from_vector(kp_add, {p.batch, T});
      o.key_padding_mode = kernels::MaskMode::add;
      o.attn_mask = from_vector(am_mul, {T, T});
      o.attn_mask_mode = kernels::MaskMode::mul;
      require_close(kernels::block_sparse_softmax(x, p.layout, o),
                    dense_softmax(p, x, scale, causal, kp_add, false, am_mul, true), 1e-12);
    }
  }
}

TEST_CASE("the block softmax gives 0, not NaN, for a fully masked row", "[block_sparse]") {
  // Head 0's only block of row 0 lies above the diagonal: causal hides all of it.
  const kernels::BlockLayout l = kernels::make_block_layout(
      from_vector(std::vector<int64_t>{0, 1, 0, 1}, {1, 2, 2}), 2, Device::cpu());
  const Tensor x = full({1, l.nnz, 2, 2}, 1.0, {DType::f64});
  kernels::BlockSoftmaxOptions o;
  o.causal = true;
  const std::vector<double> y = kernels::block_sparse_softmax(x, l, o).to_vector<double>();
  for (int e = 0; e < 4; ++e) CHECK(y[e] == 0.0);  // block (0, 1)
  // Block (1, 1): row 0 sees key 2 only; row 1 keys 2 and 3.
  CHECK(y[4] == 1.0);
  CHECK(y[5] == 0.0);
  CHECK(y[6] == Approx(0.5));
  CHECK(y[7] == Approx(0.5));
}

TEST_CASE("the block softmax backward is scale y (dy - sum y dy) per row", "[block_sparse]") {
  const Problem p;
  Generator g(17);
  kernels::BlockSoftmaxOptions o;
  o.scale = 0.6;
  o.causal = true;
  const Tensor y = kernels::block_sparse_softmax(
      randn({p.batch, p.layout.nnz, p.blk, p.blk}, g, {DType::f64}), p.layout, o);
  const Tensor dy = randn(y.shape(), g, {DType::f64});
  const std::vector<double> Y = p.densify(y), dY = p.densify(dy);
  const int64_t T = p.len();
  std::vector<double> dx(Y.size(), 0.0);
  for (int64_t row = 0; row < p.batch * p.heads * T; ++row) {
    double dot = 0;
    for (int64_t c = 0; c < T; ++c) dot += Y[row * T + c] * dY[row * T + c];
    for (int64_t c = 0; c < T; ++c)
      dx[row * T + c] = 0.6 * Y[row * T + c] * (dY[row * T + c] - dot);
  }
  require_close(kernels::block_sparse_softmax_backward(y, dy, p.layout, 0.6), p.sparsify(dx),
                1e-12);
}

TEST_CASE("f32 kernels agree with f64 and repeat bit for bit", "[block_sparse]") {
  const Problem p;
  const Tensor q = p.q.to(DType::f32), k = p.k.to(DType::f32), v = p.v.to(DType::f32);
  const Tensor s64 = kernels::block_sparse_sdd(p.q, p.k, p.layout);
  const Tensor s = kernels::block_sparse_sdd(q, k, p.layout);
  require_close(s, s64.to_vector<double>(), 1e-5);
  const Tensor o1 = kernels::block_sparse_dsd(s, v, p.layout, true);
  const Tensor o2 = kernels::block_sparse_dsd(s, v, p.layout, true);
  CHECK(o1.to_vector<float>() == o2.to_vector<float>());
}

TEST_CASE("bad block-sparse inputs are refused with what was expected", "[block_sparse]") {
  const Problem p;
  CHECK_THAT(error_of([&] {
               kernels::block_sparse_sdd(p.q.narrow(2, 0, 16), p.k.narrow(2, 0, 16), p.layout);
             }),
             Catch::Contains("expected a of shape (B, 3, 20, D)"));
  CHECK_THAT(error_of([&] { kernels::block_sparse_dsd(p.q, p.v, p.layout, false); }),
             Catch::Contains("expected s of shape (B, " + std::to_string(p.layout.nnz)));
  CHECK_THAT(error_of([&] {
               kernels::make_block_layout(full({2, 3, 4}, 1.0, {DType::i64}), 4, Device::cpu());
             }),
             Catch::Contains("expected a layout of shape (H, nb, nb)"));
  CHECK_THAT(error_of([&] {
               kernels::make_block_layout(full({1, 2, 2}, 1.0, {DType::f32}), 4, Device::cpu());
             }),
             Catch::Contains("expected an integer or bool layout"));
  kernels::BlockSoftmaxOptions o;
  o.key_padding_mask = zeros({p.batch, 7}, {DType::f64});
  const Tensor x = zeros({p.batch, p.layout.nnz, p.blk, p.blk}, {DType::f64});
  CHECK_THAT(error_of([&] { kernels::block_sparse_softmax(x, p.layout, o); }),
             Catch::Contains("key_padding_mask"));
}

}  // namespace
}  // namespace tessera
