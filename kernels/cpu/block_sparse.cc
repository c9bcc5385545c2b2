#include "kernels/cpu/block_sparse.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// Note [Block-sparse attention on the CPU]
// Each worker owns whole output blocks: SDD one nonzero block, DSD one (batch, head, block
// row) of the output (its column when transposed), the softmax one (batch, block row), so
// no two threads write the same memory and the static partition gives the same bits on
// every run. The block products are small Eigen products of (block, D) panels, which stay
// in cache; nothing of size (T, T) exists.

// The layout's tables, read on the host.
struct Tables {
  explicit Tables(const BlockLayout& l)
      : row_start(l.row_start.data_ptr<int32_t>()),
        nz_col(l.nz_col.data_ptr<int32_t>()),
        nz_row(l.nz_row.data_ptr<int32_t>()),
        col_start(l.col_start.data_ptr<int32_t>()),
        col_nz(l.col_nz.data_ptr<int32_t>()) {}
  const int32_t* row_start;
  const int32_t* nz_col;
  const int32_t* nz_row;
  const int32_t* col_start;
  const int32_t* col_nz;
};

// Work items below this many multiply-adds are grouped into one task.
constexpr int64_t kGrainFlops = int64_t{1} << 16;

int64_t grain_for(int64_t flops_per_item) {
  return std::max<int64_t>(1, kGrainFlops / std::max<int64_t>(1, flops_per_item));
}

// The grain of a loop over block rows (or columns), `flops_per_block` per nonzero block.
int64_t line_grain(const BlockLayout& l, int64_t flops_per_block) {
  const int64_t per_line = std::max<int64_t>(1, l.nnz / std::max<int64_t>(1, l.heads * l.blocks));
  return grain_for(per_line * flops_per_block);
}

}  // namespace

Tensor block_sparse_sdd(const Tensor& a_in, const Tensor& b_in, const BlockLayout& layout) {
  if (is_half(a_in.dtype())) {
    return narrowed(cpu::block_sparse_sdd(widened(a_in), widened(b_in), layout), a_in.dtype());
  }
  const Tensor a = a_in.detach().contiguous();  // (B, H, T, D)
  const Tensor b = b_in.detach().contiguous();  // (B, H, T, D)
  const int64_t batch = a.size(0), len = a.size(2), dim = a.size(3);
  const int64_t blk = layout.block, nnz = layout.nnz, nb = layout.blocks;
  Tensor out = empty({batch, nnz, blk, blk}, {a.dtype(), a.device()});
  const Tables t(layout);
  dispatch_floating(a.dtype(), "block_sparse_sdd", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    const T* pb = b.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(batch * nnz, grain_for(blk * blk * dim), [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t n = w / nnz, z = w % nnz;
        const int64_t h = t.nz_row[z] / nb, i = t.nz_row[z] % nb, j = t.nz_col[z];
        const int64_t head = (n * layout.heads + h) * len;
        const ConstMatrixMap<T> A(pa + (head + i * blk) * dim, blk, dim);
        const ConstMatrixMap<T> B(pb + (head + j * blk) * dim, blk, dim);
        MatrixMap<T> O(po + w * blk * blk, blk, blk);
        O.noalias() = A * B.transpose();
      }
    });
  });
  return out;
}

Tensor block_sparse_dsd(const Tensor& s_in, const Tensor& x_in, const BlockLayout& layout,
                        bool transpose_s) {
  if (is_half(x_in.dtype())) {
    return narrowed(cpu::block_sparse_dsd(widened(s_in), widened(x_in), layout, transpose_s),
                    x_in.dtype());
  }
  const Tensor s = s_in.detach().contiguous();  // (B, nnz, block, block)
  const Tensor x = x_in.detach().contiguous();  // (B, H, T, D)
  const int64_t batch = x.size(0), len = x.size(2), dim = x.size(3);
  const int64_t blk = layout.block, nnz = layout.nnz, nb = layout.blocks;
  const int64_t lines = layout.heads * nb;  // output block rows (columns) per batch
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  const Tables t(layout);
  const int32_t* start = transpose_s ? t.col_start : t.row_start;
  dispatch_floating(x.dtype(), "block_sparse_dsd", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ps = s.data_ptr<T>();
    const T* px = x.data_ptr<T>();
    T* po = out.data_ptr<T>();
    parallel_for(batch * lines, line_grain(layout, blk * blk * dim), [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t n = w / lines, line = w % lines;  // line = h nb + (i, or j transposed)
        const int64_t h = line / nb, own = line % nb;
        const int64_t head = (n * layout.heads + h) * len;
        MatrixMap<T> O(po + (head + own * blk) * dim, blk, dim);
        O.setZero();
        for (int32_t e = start[line]; e < start[line + 1]; ++e) {
          // Row-wise the entry is the nonzero; column-wise it indexes the nonzero.
          const int64_t z = transpose_s ? t.col_nz[e] : e;
          const int64_t other = transpose_s ? t.nz_row[z] % nb : t.nz_col[z];
          const ConstMatrixMap<T> S(ps + (n * nnz + z) * blk * blk, blk, blk);
          const ConstMatrixMap<T> X(px + (head + other * blk) * dim, blk, dim);
          if (transpose_s) {
            O.noalias() += S.transpose() * X;
          } else {
            O.noalias() += S * X;
          }
        }
      }
    });
  });
  return out;
}

Tensor block_sparse_softmax(const Tensor& x_in, const BlockLayout& layout,
                            const BlockSoftmaxOptions& options) {
  if (is_half(x_in.dtype())) {
    BlockSoftmaxOptions wide = options;
    wide.key_padding_mask = widened(options.key_padding_mask);
    wide.attn_mask = widened(options.attn_mask);
    return narrowed(cpu::block_sparse_softmax(widened(x_in), layout, wide), x_in.dtype());
  }
  const Tensor x = x_in.detach().contiguous();  // (B, nnz, block, block)
  const Tensor kp =
      options.key_padding_mask.defined() ? options.key_padding_mask.contiguous() : Tensor();
  const Tensor am = options.attn_mask.defined() ? options.attn_mask.contiguous() : Tensor();
  const int64_t batch = x.size(0), len = layout.seq_len();
  const int64_t blk = layout.block, nnz = layout.nnz, nb = layout.blocks;
  const int64_t lines = layout.heads * nb;
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  const Tables t(layout);
  dispatch_floating(x.dtype(), "block_sparse_softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    const T scale = static_cast<T>(options.scale);
    const T* px = x.data_ptr<T>();
    const T* pkp = kp.defined() ? kp.data_ptr<T>() : nullptr;
    const T* pam = am.defined() ? am.data_ptr<T>() : nullptr;
    const bool kp_mul = options.key_padding_mode == MaskMode::mul;
    const bool am_mul = options.attn_mask_mode == MaskMode::mul;
    T* po = out.data_ptr<T>();
    // Adds a mask's `blk` values for keys [k0, k0 + blk) to the row segment `v`.
    const auto apply = [blk, kNegInf](ArrayMap<T> v, const T* mask, bool mul) {
      if (mul) {
        for (int64_t c = 0; c < blk; ++c) v[c] = mask[c] == T(0) ? kNegInf : v[c];
      } else {
        v += ConstArrayMap<T>(mask, blk);
      }
    };
    parallel_for(batch * lines, line_grain(layout, blk * blk * 4), [&](int64_t w0, int64_t w1) {
      // One query row over all its blocks, gathered contiguously so that the max, exp and
      // sum run vectorized.
      ArrayX<T> row(nb * blk);
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t n = w / lines, line = w % lines, i = line % nb;
        const int32_t z0 = t.row_start[line], z1 = t.row_start[line + 1];
        const int64_t width = (z1 - z0) * blk;
        if (width == 0) continue;
        for (int64_t r = 0; r < blk; ++r) {
          const int64_t q = i * blk + r;
          for (int32_t z = z0; z < z1; ++z) {
            const int64_t k0 = int64_t{t.nz_col[z]} * blk;
            ArrayMap<T> v(row.data() + (z - z0) * blk, blk);
            if (options.causal && k0 > q) {
              v.setConstant(kNegInf);
              continue;
            }
            v = scale * ConstArrayMap<T>(px + ((n * nnz + z) * blk + r) * blk, blk);
            if (options.causal) {
              for (int64_t c = std::max<int64_t>(0, q - k0 + 1); c < blk; ++c) v[c] = kNegInf;
            }
            if (pkp != nullptr) apply(v, pkp + n * len + k0, kp_mul);
            if (pam != nullptr) apply(v, pam + q * len + k0, am_mul);
          }
          auto seg = row.head(width);
          const T max = seg.maxCoeff();
          if (max == kNegInf) {
            seg.setZero();  // every key hidden: probabilities 0, not NaN
          } else {
            seg = (seg - max).exp();
            seg *= T(1) / seg.sum();
          }
          for (int32_t z = z0; z < z1; ++z) {
            ArrayMap<T>(po + ((n * nnz + z) * blk + r) * blk, blk) =
                seg.segment((z - z0) * blk, blk);
          }
        }
      }
    });
  });
  return out;
}

Tensor block_sparse_softmax_backward(const Tensor& y_in, const Tensor& dy_in,
                                     const BlockLayout& layout, double scale) {
  if (is_half(y_in.dtype())) {
    return narrowed(
        cpu::block_sparse_softmax_backward(widened(y_in), widened(dy_in), layout, scale),
        y_in.dtype());
  }
  const Tensor y = y_in.detach().contiguous();    // (B, nnz, block, block)
  const Tensor dy = dy_in.detach().contiguous();  // (B, nnz, block, block)
  const int64_t batch = y.size(0);
  const int64_t blk = layout.block, nnz = layout.nnz, nb = layout.blocks;
  const int64_t lines = layout.heads * nb;
  Tensor dx = empty(y.shape(), {y.dtype(), y.device()});
  const Tables t(layout);
  dispatch_floating(y.dtype(), "block_sparse_softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(scale);
    const T* py = y.data_ptr<T>();
    const T* pdy = dy.data_ptr<T>();
    T* pdx = dx.data_ptr<T>();
    parallel_for(batch * lines, line_grain(layout, blk * blk * 2), [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t n = w / lines, line = w % lines;
        const int32_t z0 = t.row_start[line], z1 = t.row_start[line + 1];
        for (int64_t r = 0; r < blk; ++r) {
          T dot = 0;
          for (int32_t z = z0; z < z1; ++z) {
            const int64_t at = ((n * nnz + z) * blk + r) * blk;
            dot += (ConstArrayMap<T>(py + at, blk) * ConstArrayMap<T>(pdy + at, blk)).sum();
          }
          for (int32_t z = z0; z < z1; ++z) {
            const int64_t at = ((n * nnz + z) * blk + r) * blk;
            ArrayMap<T>(pdx + at, blk) =
                s * ConstArrayMap<T>(py + at, blk) * (ConstArrayMap<T>(pdy + at, blk) - dot);
          }
        }
      }
    });
  });
  return dx;
}

}  // namespace tessera::kernels::cpu
