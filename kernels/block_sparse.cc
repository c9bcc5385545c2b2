// Validation, the layout tables and the device switch of the block-sparse kernels.
#include "kernels/block_sparse.h"

#include <cmath>
#include <vector>

#include "core/factories.h"
#include "kernels/checks.h"
#include "kernels/cpu/block_sparse.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

// The layout's tables must live where the data does.
void check_layout(const char* op, const char* name, const Tensor& t, const BlockLayout& layout) {
  TS_CHECK(layout.row_start.defined(), "[", op,
           "] expected a layout from make_block_layout, found an empty one");
  TS_CHECK(layout.device() == t.device(), "[", op, "] expected the layout's tables on ", t.device(),
           " (where ", name, " is), found them on ", layout.device());
}

// A dense operand (B, H, T, D) over the layout's heads and sequence length.
void check_dense(const char* op, const char* name, const Tensor& t, const BlockLayout& layout) {
  check_defined(op, name, t);
  check_floating(op, name, t);
  TS_CHECK(t.dim() == 4 && t.size(1) == layout.heads && t.size(2) == layout.seq_len(), "[", op,
           "] expected ", name, " of shape (B, ", layout.heads, ", ", layout.seq_len(),
           ", D) for the layout's heads and length, found ", shape_str(t.shape()));
  check_layout(op, name, t, layout);
}

// A sparse operand (B, nnz, block, block).
void check_sparse(const char* op, const char* name, const Tensor& t, const BlockLayout& layout) {
  check_defined(op, name, t);
  check_floating(op, name, t);
  TS_CHECK(t.dim() == 4 && t.size(1) == layout.nnz && t.size(2) == layout.block &&
               t.size(3) == layout.block,
           "[", op, "] expected ", name, " of shape (B, ", layout.nnz, ", ", layout.block, ", ",
           layout.block, ") for the layout's nonzero blocks, found ", shape_str(t.shape()));
  check_layout(op, name, t, layout);
}

void check_mask(const char* op, const char* name, const Tensor& mask, const Tensor& x,
                const Shape& shape) {
  if (!mask.defined()) return;
  check_same_dtype(op, "x", x, name, mask);
  check_same_device(op, "x", x, name, mask);
  check_shape(op, name, mask, shape);
}

// The i32 tensor of `values` on `device`.
Tensor index_tensor(const std::vector<int32_t>& values, Device device) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).to(device);
}

}  // namespace

BlockLayout make_block_layout(const Tensor& layout_in, int64_t block, Device device) {
  constexpr const char* op = "make_block_layout";
  check_defined(op, "layout", layout_in);
  TS_CHECK(layout_in.dim() == 3 && layout_in.size(1) == layout_in.size(2), "[", op,
           "] expected a layout of shape (H, nb, nb), found ", shape_str(layout_in.shape()));
  TS_CHECK(layout_in.device().is_cpu(), "[", op, "] expected the layout on the cpu, found it on ",
           layout_in.device());
  TS_CHECK(!is_floating(layout_in.dtype()), "[", op,
           "] expected an integer or bool layout, found dtype ", dtype_name(layout_in.dtype()));
  TS_CHECK(block > 0, "[", op, "] expected a block size > 0, found ", block);
  const std::vector<int64_t> bits = layout_in.to(DType::i64).contiguous().to_vector<int64_t>();
  BlockLayout l;
  l.heads = layout_in.size(0);
  l.blocks = layout_in.size(1);
  l.block = block;
  const int64_t rows = l.heads * l.blocks;
  TS_CHECK(rows * l.blocks < (int64_t{1} << 31), "[", op,
           "] expected fewer than 2^31 blocks, found ", rows * l.blocks);
  std::vector<int32_t> row_start{0}, nz_col, nz_row;
  std::vector<int32_t> col_count(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / l.blocks;
    for (int64_t j = 0; j < l.blocks; ++j) {
      if (bits[r * l.blocks + j] == 0) continue;
      nz_col.push_back(static_cast<int32_t>(j));
      nz_row.push_back(static_cast<int32_t>(r));
      ++col_count[h * l.blocks + j];
    }
    row_start.push_back(static_cast<int32_t>(nz_col.size()));
  }
  l.nnz = static_cast<int64_t>(nz_col.size());
  // The nonzeros by (head, column): a counting sort keeps each column's rows in order.
  std::vector<int32_t> col_start(rows + 1, 0);
  for (int64_t c = 0; c < rows; ++c) col_start[c + 1] = col_start[c] + col_count[c];
  std::vector<int32_t> col_nz(l.nnz), fill(col_start.begin(), col_start.end() - 1);
  for (int64_t z = 0; z < l.nnz; ++z) {
    const int64_t h = nz_row[z] / l.blocks;
    col_nz[fill[h * l.blocks + nz_col[z]]++] = static_cast<int32_t>(z);
  }
  l.row_start = index_tensor(row_start, device);
  l.nz_col = index_tensor(nz_col, device);
  l.nz_row = index_tensor(nz_row, device);
  l.col_start = index_tensor(col_start, device);
  l.col_nz = index_tensor(col_nz, device);
  return l;
}

Tensor block_sparse_sdd(const Tensor& a, const Tensor& b, const BlockLayout& layout) {
  constexpr const char* op = "block_sparse_sdd";
  check_dense(op, "a", a, layout);
  check_same_dtype(op, "a", a, "b", b);
  check_same_device(op, "a", a, "b", b);
  check_same_shape(op, "a", a, "b", b);
  if (a.device().is_cuda()) return cuda::block_sparse_sdd(a, b, layout);
  return cpu::block_sparse_sdd(a, b, layout);
}

Tensor block_sparse_dsd(const Tensor& s, const Tensor& x, const BlockLayout& layout,
                        bool transpose_s) {
  constexpr const char* op = "block_sparse_dsd";
  check_sparse(op, "s", s, layout);
  check_dense(op, "x", x, layout);
  check_same_dtype(op, "s", s, "x", x);
  check_same_device(op, "s", s, "x", x);
  TS_CHECK(s.size(0) == x.size(0), "[", op, "] expected s and x with the same batch, found ",
           s.size(0), " and ", x.size(0));
  if (s.device().is_cuda()) return cuda::block_sparse_dsd(s, x, layout, transpose_s);
  return cpu::block_sparse_dsd(s, x, layout, transpose_s);
}

Tensor block_sparse_softmax(const Tensor& x, const BlockLayout& layout,
                            const BlockSoftmaxOptions& options) {
  constexpr const char* op = "block_sparse_softmax";
  check_sparse(op, "x", x, layout);
  TS_CHECK(std::isfinite(options.scale), "[", op, "] expected a finite scale, found ",
           options.scale);
  check_mask(op, "key_padding_mask", options.key_padding_mask, x, {x.size(0), layout.seq_len()});
  check_mask(op, "attn_mask", options.attn_mask, x, {layout.seq_len(), layout.seq_len()});
  if (x.device().is_cuda()) return cuda::block_sparse_softmax(x, layout, options);
  return cpu::block_sparse_softmax(x, layout, options);
}

Tensor block_sparse_softmax_backward(const Tensor& y, const Tensor& dy, const BlockLayout& layout,
                                     double scale) {
  constexpr const char* op = "block_sparse_softmax_backward";
  check_sparse(op, "y", y, layout);
  check_same_dtype(op, "y", y, "dy", dy);
  check_same_device(op, "y", y, "dy", dy);
  check_same_shape(op, "y", y, "dy", dy);
  if (y.device().is_cuda()) return cuda::block_sparse_softmax_backward(y, dy, layout, scale);
  return cpu::block_sparse_softmax_backward(y, dy, layout, scale);
}

}  // namespace tessera::kernels
