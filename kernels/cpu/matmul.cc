#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/half_convert.h"
#include "core/parallel.h"
#include "kernels/checks.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// Note [Matrix operands without copies]
// GEMM reads a matrix in place when one of its last two dims has unit stride: a row-major
// matrix, or a column-major one (a transposed view), each with a leading dimension so that
// rows of a wider tensor (a narrow() of the last dim) need no copy either. The trans flag
// and the stored order combine into the storage order of op(X) as Eigen sees it, so four
// GEMM variants per dtype cover every layout and flag. Other layouts (expanded, or strided
// in both dims) are copied to contiguous first.

template <class T, int Order>
using ConstMatrixMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>,
                                  Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using RowMatrixMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                                Eigen::Unaligned, Eigen::OuterStride<>>;

// One op(X) as GEMM reads it.
struct Operand {
  Tensor t;        // the tensor read: the input, or its contiguous copy
  bool row_major;  // storage order of each op(X) matrix
  int64_t ld;      // elements between consecutive rows (row-major) or columns (column-major)
};

Operand make_operand(const Tensor& x, bool trans) {  // (..., R, C), detached
  const int64_t rows = x.size(-2);
  const int64_t cols = x.size(-1);
  const int64_t row_stride = x.stride(-2);
  const int64_t col_stride = x.stride(-1);
  if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= cols)) {
    return {x, !trans, rows == 1 ? cols : row_stride};
  }
  if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= rows)) {
    return {x, trans, cols == 1 ? rows : col_stride};
  }
  return {x.contiguous(), !trans, cols};
}

// Offset in elements of every matrix of x over its leading dims, in row-major batch order.
std::vector<int64_t> batch_offsets(const Tensor& x) {  // (..., R, C)
  const int64_t nd = x.dim() - 2;
  int64_t count = 1;
  for (int64_t d = 0; d < nd; ++d) count *= x.size(d);
  std::vector<int64_t> offsets(count);
  std::vector<int64_t> idx(nd, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    offsets[i] = offset;
    for (int64_t d = nd - 1; d >= 0; --d) {
      offset += x.stride(d);
      if (++idx[d] < x.size(d)) break;
      offset -= x.stride(d) * x.size(d);
      idx[d] = 0;
    }
  }
  return offsets;
}

// When all rows of a, over its leading dims and its row dim, are one stride apart and
// unit-strided inside, that stride: a is then one tall (batch * M, K) row-major matrix.
std::optional<int64_t> tall_row_stride(const Tensor& a) {  // (..., M, K)
  const int64_t k = a.size(-1);
  if (k != 1 && a.stride(-1) != 1) return std::nullopt;
  int64_t stride = k;  // the leading dimension when a has a single row
  int64_t span = 0;    // rows covered by the non-trivial dims seen so far
  for (int64_t d = a.dim() - 2; d >= 0; --d) {
    if (a.size(d) == 1) continue;
    if (span == 0) {
      stride = a.stride(d);
      span = 1;
    } else if (a.stride(d) != stride * span) {
      return std::nullopt;
    }
    span *= a.size(d);
  }
  if (stride < k) return std::nullopt;  // overlapping (expanded) rows
  return stride;
}

// Note [GEMM threading]
// Eigen's own threading splits one GEMM across threads but zeroes the whole output on the
// calling thread first and scales poorly on wide products such as the LM head (256 x 768 x
// 50304). Instead each thread computes a block of output columns or rows (see gemm_kernel)
// with a one-thread GEMM (packed or Eigen, see gemm_block): Eigen runs single-threaded
// inside a parallel region, and every thread zeroes only its own block.
constexpr int64_t kMinThreadedFlops = int64_t{1} << 22;
constexpr int64_t kSplitAlign = 16;  // block edges at multiples of 16 elements (64 bytes)

// One block on the calling thread: the packed kernel for f32 where the build has it (Note
// [Packed SGEMM]), Eigen otherwise and for matrix-vector shapes, where packing a whole
// operand would cost more than the product; 16-bit products in half_block below. A
// non-null bias (n) is added to every row of c.
constexpr int64_t kMinPackedExtent = 16;

template <class T, int OrderA, int OrderB>
void gemm_block_f32_f64(const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc,
                        int64_t m, int64_t n, int64_t k, const T* bias) {
  if constexpr (std::is_same_v<T, float> && kHavePackedSgemm) {
    if (m >= kMinPackedExtent && n >= kMinPackedExtent) {
      constexpr bool a_rows = OrderA == Eigen::RowMajor;
      constexpr bool b_rows = OrderB == Eigen::RowMajor;
      sgemm({a, a_rows ? lda : 1, a_rows ? 1 : lda}, {b, b_rows ? ldb : 1, b_rows ? 1 : ldb}, c,
            ldc, m, n, k, bias);
      return;
    }
  }
  ConstMatrixMap<T, OrderA> A(a, m, k, Eigen::OuterStride<>(lda));
  ConstMatrixMap<T, OrderB> B(b, k, n, Eigen::OuterStride<>(ldb));
  RowMatrixMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  C.noalias() = A * B;
  if (bias != nullptr) {
    C.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, n);
  }
}

// One block of a 16-bit product: the f32 sums of up to kHalfColumns columns at a time in a
// buffer, each rounded once into c; the bias joins the sums in f32. bf16 runs on its own
// kernels (Note [BF16 GEMM]), f16 on the packed f32 kernel, which converts f16 to f32 as it
// packs (sgemm's HalfMatrix overload), so neither operand is widened in a copy of its own.
constexpr int64_t kHalfColumns = 1536;

template <class T, int OrderA, int OrderB>
void half_block(const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, int64_t m,
                int64_t n, int64_t k, const T* bias) {
  constexpr bool kBf16 = std::is_same_v<T, BFloat16>;
  if constexpr (kBf16 ? kHaveBf16Gemm : kHavePackedSgemm) {
    std::unique_ptr<float[]> bias_f32;
    if (bias != nullptr) {
      bias_f32.reset(new float[n]);
      load_floats<T>(reinterpret_cast<const char*>(bias), sizeof(T), n, bias_f32.get());
    }
    const int64_t width = std::min(n, kHalfColumns);
    std::unique_ptr<float[]> sums(new float[m * width]);  // (m, width), every element written
    constexpr bool a_row_major = OrderA == Eigen::RowMajor;
    constexpr bool b_row_major = OrderB == Eigen::RowMajor;
    const StridedOf<T> op_a{a, a_row_major ? lda : 1, a_row_major ? 1 : lda};
    for (int64_t j0 = 0; j0 < n; j0 += width) {
      const int64_t cols = std::min(width, n - j0);
      const StridedOf<T> op_b{b_row_major ? b + j0 : b + j0 * ldb, b_row_major ? ldb : 1,
                              b_row_major ? 1 : ldb};
      const float* cols_bias = bias_f32 ? bias_f32.get() + j0 : nullptr;
      if constexpr (kBf16) {
        bf16_gemm(op_a, op_b, sums.get(), cols, m, cols, k, cols_bias, best_bf16_kernel());
      } else {
        sgemm(op_a, op_b, sums.get(), cols, m, cols, k, cols_bias);
      }
      for (int64_t i = 0; i < m; ++i)
        store_floats<T>(sums.get() + i * cols, cols, c + i * ldc + j0);
    }
  } else {
    TS_INTERNAL_ASSERT(false, "16-bit GEMM without its kernel: its operands are widened");
  }
}

template <class T, int OrderA, int OrderB>
void gemm_block(const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, int64_t m,
                int64_t n, int64_t k, const T* bias) {
  if constexpr (kIsHalf<T>) {
    half_block<T, OrderA, OrderB>(a, lda, b, ldb, c, ldc, m, n, k, bias);
  } else {
    gemm_block_f32_f64<T, OrderA, OrderB>(a, lda, b, ldb, c, ldc, m, n, k, bias);
  }
}

template <class T, int OrderA, int OrderB>
void gemm_kernel(const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t m, int64_t n,
                 int64_t k, const T* bias) {
  const int64_t threads = in_parallel_region() ? 1 : num_threads();
  if (threads == 1 || m * n * k < kMinThreadedFlops) {
    gemm_block<T, OrderA, OrderB>(a, lda, b, ldb, c, n, m, n, k, bias);
    return;
  }
  // Each thread reads all of the operand that is not split: split the dimension that makes
  // it the cheaper one, counting an operand the packed kernel must pack (op(A) not row-major,
  // op(B) not row-major) twice. Splitting the rows of the 768 x 768 attention projection's
  // weight gradient (A = dY^T packed, B = x in place) instead of its columns is 1.25x faster.
  const int64_t a_cost = m * (OrderA == Eigen::RowMajor ? 1 : 2);
  const int64_t b_cost = n * (OrderB == Eigen::RowMajor ? 1 : 2);
  const bool split_cols = a_cost <= b_cost;
  const int64_t extent = split_cols ? n : m;
  const int64_t chunk =
      ((extent + threads - 1) / threads + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  const int64_t parts = (extent + chunk - 1) / chunk;
  parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = p * chunk;
      const int64_t len = std::min(chunk, extent - lo);
      if (split_cols) {  // columns lo.. of op(B) and of C
        const T* bp = OrderB == Eigen::RowMajor ? b + lo : b + lo * ldb;
        gemm_block<T, OrderA, OrderB>(a, lda, bp, ldb, c + lo, n, m, len, k,
                                      bias == nullptr ? nullptr : bias + lo);
      } else {  // rows lo.. of op(A) and of C
        const T* ap = OrderA == Eigen::RowMajor ? a + lo * lda : a + lo;
        gemm_block<T, OrderA, OrderB>(ap, lda, b, ldb, c + lo * n, n, len, n, k, bias);
      }
    }
  });
}

// c = op(a) @ op(b) (+ bias (N) on every row when not null) for one (M, K) x (K, N) product
// into a contiguous (M, N) c.
template <class T>
void gemm(const T* a, bool a_row_major, int64_t lda, const T* b, bool b_row_major, int64_t ldb,
          T* c, int64_t m, int64_t n, int64_t k, const T* bias) {
  constexpr int kRow = Eigen::RowMajor;
  constexpr int kCol = Eigen::ColMajor;
  if (a_row_major && b_row_major) {
    gemm_kernel<T, kRow, kRow>(a, lda, b, ldb, c, m, n, k, bias);
  } else if (a_row_major) {
    gemm_kernel<T, kRow, kCol>(a, lda, b, ldb, c, m, n, k, bias);
  } else if (b_row_major) {
    gemm_kernel<T, kCol, kRow>(a, lda, b, ldb, c, m, n, k, bias);
  } else {
    gemm_kernel<T, kCol, kCol>(a, lda, b, ldb, c, m, n, k, bias);
  }
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b,
              const Tensor& bias_in) {
  // bf16 has a GEMM of its own where the build has AVX512_BF16 (Note [BF16 GEMM]), f16 the
  // packed f32 kernel, which converts as it packs, where the build has AVX-512; without
  // them the operands are widened to f32.
  const bool bf16_kernel = a_in.dtype() == DType::bf16 && kHaveBf16Gemm;
  const bool f16_kernel = a_in.dtype() == DType::f16 && kHavePackedSgemm;
  if (is_half(a_in.dtype()) && !bf16_kernel && !f16_kernel) {
    return narrowed(cpu::matmul(widened(a_in), widened(b_in), trans_a, trans_b, widened(bias_in)),
                    a_in.dtype());
  }
  const Tensor a = a_in.detach();  // (..., M, K) or (..., K, M)
  const Tensor b = b_in.detach();  // (K, N) or (N, K), or batched like a
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  out_shape.push_back(m);
  out_shape.push_back(n);
  Tensor out = empty(out_shape, {a.dtype(), a.device()});  // (..., M, N)
  if (out.numel() == 0) return out;
  const Tensor bias = contiguous_or_undefined(bias_in);  // (N)
  if (k == 0) {
    if (bias.defined()) {
      out.copy_(bias.expand(out.shape()));
    } else {
      out.fill_(0.0);
    }
    return out;
  }
  const auto multiply = [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* c = out.data_ptr<T>();
    const T* pbias = bias.defined() ? bias.template data_ptr<T>() : nullptr;
    const Operand ob = make_operand(b, trans_b);
    const T* pb = ob.t.template data_ptr<T>();
    if (b.dim() == 2 && !trans_a) {
      if (const std::optional<int64_t> lda = tall_row_stride(a)) {
        gemm<T>(a.data_ptr<T>(), true, *lda, pb, ob.row_major, ob.ld, c, out.numel() / n, n, k,
                pbias);
        return;
      }
    }
    const Operand oa = make_operand(a, trans_a);
    const T* pa = oa.t.template data_ptr<T>();
    const std::vector<int64_t> a_offsets = batch_offsets(oa.t);
    const std::vector<int64_t> b_offsets =
        b.dim() == 2 ? std::vector<int64_t>(a_offsets.size(), 0) : batch_offsets(ob.t);
    const auto run = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        gemm<T>(pa + a_offsets[i], oa.row_major, oa.ld, pb + b_offsets[i], ob.row_major, ob.ld,
                c + i * m * n, m, n, k, pbias);
      }
    };
    // Note [Batched GEMM threading]: with at least one batch per thread, threads take
    // whole batches; Eigen then sees the parallel region and runs each GEMM on one thread,
    // so the two never oversubscribe. Fewer batches run in turn, each threaded by Eigen.
    const int64_t batches = static_cast<int64_t>(a_offsets.size());
    if (batches >= num_threads()) {
      parallel_for(batches, 1, run);
    } else {
      run(0, batches);
    }
  };
  if (bf16_kernel) {
    multiply(TypeTag<BFloat16>{});
  } else if (f16_kernel) {
    multiply(TypeTag<Half>{});
  } else {
    dispatch_floating(a.dtype(), "matmul", multiply);
  }
  return out;
}

}  // namespace tessera::kernels::cpu
