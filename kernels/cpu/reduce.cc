// CPU reductions over a contiguous (outer, reduced, inner) block.
//
// Note [Pairwise sums]
// Sums are pairwise: leaves of kLeaf elements add into 8 lane accumulators, and halves
// are added recursively, so the rounding error grows with log(n), not n, and f32 needs no
// f64 accumulator. Long rows are cut into kChunk pieces summed in parallel and combined
// pairwise in a fixed order: the result does not depend on the thread count.
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/widen.h"
#include "kernels/reduce_dims.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kLeaf = 128;     // elements a pairwise leaf adds directly
constexpr int64_t kLeafRows = 16;  // rows a column-sum leaf adds directly
constexpr int64_t kColumns = 64;   // columns one task of a column reduction owns
constexpr int64_t kChunk = 65536;  // elements per parallel task

// Sum of f(p[i]) for i < n (Note [Pairwise sums]).
template <class T, class F>
T pairwise_sum(const T* p, int64_t n, const F& f) {
  if (n > kLeaf) {
    const int64_t half = n / 2;
    return pairwise_sum(p, half, f) + pairwise_sum(p + half, n - half, f);
  }
  T lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += f(p[i + j]);
  }
  T s = 0;
  for (; i < n; ++i) s += f(p[i]);
  return s + (((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])));
}

// out[j] = sum over i < rows of f(j, p[i * stride + j]) for j < width <= kColumns,
// pairwise over the rows.
template <class T, class F>
void column_sum(const T* p, int64_t rows, int64_t stride, int64_t width, T* out, const F& f) {
  if (rows > kLeafRows) {
    const int64_t half = rows / 2;
    T right[kColumns];
    column_sum(p, half, stride, width, out, f);
    column_sum(p + half * stride, rows - half, stride, width, right, f);
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) out[j] += right[j];
    return;
  }
  std::fill_n(out, width, T(0));
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = p + i * stride;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) out[j] += f(j, row[j]);
  }
}

// f(i, v) = v: plain sums.
struct Identity {
  template <class T>
  T operator()(int64_t, T v) const {
    return v;
  }
};

// out[o * inner + c] = sum over r of f(o * inner + c, x[o, r, c]) for a contiguous block.
template <class T, class F>
void reduce_sum(const T* x, int64_t outer, int64_t reduced, int64_t inner, T* out, const F& f) {
  if (inner > 1) {
    // Tasks own (outer, row chunk, column block) pieces; when there is more than one row
    // chunk, their partial sums are combined by a second, smaller column reduction.
    const int64_t blocks = (inner + kColumns - 1) / kColumns;
    const int64_t chunk_rows = std::max(kLeafRows, kChunk / std::min(inner, kColumns));
    const int64_t chunks = std::max<int64_t>(1, (reduced + chunk_rows - 1) / chunk_rows);
    std::vector<T> partial(static_cast<size_t>(chunks > 1 ? outer * chunks * inner : 0));
    T* dst = chunks > 1 ? partial.data() : out;
    const int64_t grain = std::max<int64_t>(
        1, kChunk / std::max<int64_t>(std::min(reduced, chunk_rows) * kColumns, 1));
    parallel_for(outer * chunks * blocks, grain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t o = t / (chunks * blocks);
        const int64_t chunk = t / blocks % chunks;
        const int64_t c0 = t % blocks * kColumns;
        const int64_t r0 = chunk * chunk_rows;
        const int64_t base = o * inner + c0;
        column_sum(x + (o * reduced + r0) * inner + c0, std::min(chunk_rows, reduced - r0), inner,
                   std::min(kColumns, inner - c0), dst + (o * chunks + chunk) * inner + c0,
                   [&](int64_t j, T v) { return f(base + j, v); });
      }
    });
    if (chunks > 1) reduce_sum(partial.data(), outer, chunks, inner, out, Identity());
    return;
  }
  // Rows: each is cut into `chunks` pieces summed in parallel, then combined pairwise.
  const int64_t chunks = std::max<int64_t>(1, (reduced + kChunk - 1) / kChunk);
  const int64_t piece = chunks == 1 ? reduced : kChunk;
  std::vector<T> partial(static_cast<size_t>(outer * chunks));
  const int64_t grain = std::max<int64_t>(1, kChunk / std::max<int64_t>(piece, 1));
  parallel_for(outer * chunks, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / chunks;
      const int64_t begin = (t % chunks) * piece;
      partial[t] = pairwise_sum(x + o * reduced + begin, std::min(piece, reduced - begin),
                                [&](T v) { return f(o, v); });
    }
  });
  for (int64_t o = 0; o < outer; ++o) {
    out[o] = pairwise_sum(partial.data() + o * chunks, chunks, [](T v) { return v; });
  }
}

// Whether v replaces the running maximum `best`: larger, or the first NaN (which then
// stays, as torch propagates NaN). Ties keep the earlier index.
template <class T>
bool replaces_max(T v, T best) {
  return v > best || (v != v && best == best);
}

// Maximum and its first index in one row. Lane j of 8 keeps the running maximum of the
// elements j, j + 8, ... (vectorizable); the lanes are then merged preferring the lower
// index on ties, and the tail is scanned last.
template <class T>
void row_max(const T* p, int64_t n, T& value, int64_t& index) {
  constexpr int kLanes = 8;
  T best[kLanes];
  int64_t at[kLanes];
  std::fill_n(best, kLanes, p[0]);
  std::fill_n(at, kLanes, 0);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      const bool take = replaces_max(p[i + j], best[j]);
      best[j] = take ? p[i + j] : best[j];
      at[j] = take ? i + j : at[j];
    }
  }
  value = best[0];
  index = at[0];
  for (int j = 1; j < kLanes; ++j) {
    const bool same = best[j] == value || (best[j] != best[j] && value != value);
    if (replaces_max(best[j], value) || (same && at[j] < index)) {
      value = best[j];
      index = at[j];
    }
  }
  for (; i < n; ++i) {
    if (replaces_max(p[i], value)) {
      value = p[i];
      index = i;
    }
  }
}

template <class T>
void reduce_max(const T* x, int64_t outer, int64_t reduced, int64_t inner, T* values,
                int64_t* indices) {
  if (inner == 1) {
    parallel_for(outer, std::max<int64_t>(1, kChunk / reduced), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) row_max(x + o * reduced, reduced, values[o], indices[o]);
    });
    return;
  }
  const int64_t blocks = (inner + kColumns - 1) / kColumns;
  const int64_t grain = std::max<int64_t>(1, kChunk / (reduced * std::min(inner, kColumns)));
  parallel_for(outer * blocks, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / blocks;
      const int64_t c0 = (t % blocks) * kColumns;
      const int64_t width = std::min(kColumns, inner - c0);
      const T* p = x + o * reduced * inner + c0;
      T* best = values + o * inner + c0;
      int64_t* best_i = indices + o * inner + c0;
      std::copy_n(p, width, best);
      std::fill_n(best_i, width, 0);
      for (int64_t r = 1; r < reduced; ++r) {
        const T* row = p + r * inner;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) {
          const bool take = replaces_max(row[j], best[j]);
          best[j] = take ? row[j] : best[j];
          best_i[j] = take ? r : best_i[j];
        }
      }
    }
  });
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {  // (*) -> (*r)
  if (is_half(x.dtype())) return narrowed(cpu::sum(widened(x), dims, keepdim), x.dtype());
  const std::vector<bool> mask = reduced_dims_mask(dims, x.dim(), "sum");
  Tensor out = empty(reduced_shape(x.shape(), mask, keepdim), {x.dtype(), x.device()});
  dispatch_floating(x.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ReduceBlock b = reduce_block_layout(x, mask);
    reduce_sum(b.data.data_ptr<T>(), b.outer, b.reduced, b.inner, out.data_ptr<T>(), Identity());
  });
  return out;
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction,
           bool keepdim) {  // (*) -> (*r)
  if (is_half(x.dtype()))
    return narrowed(cpu::var(widened(x), dims, correction, keepdim), x.dtype());
  const std::vector<bool> mask = reduced_dims_mask(dims, x.dim(), "var");
  Tensor out = empty(reduced_shape(x.shape(), mask, keepdim), {x.dtype(), x.device()});
  dispatch_floating(x.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ReduceBlock b = reduce_block_layout(x, mask);
    const T* data = b.data.data_ptr<T>();
    T* o = out.data_ptr<T>();
    // Two passes, the mean then the squared deviations from it: no cancellation.
    std::vector<T> mean(static_cast<size_t>(b.outer * b.inner));
    reduce_sum(data, b.outer, b.reduced, b.inner, mean.data(), Identity());
    for (T& m : mean) m /= static_cast<T>(b.reduced);
    reduce_sum(data, b.outer, b.reduced, b.inner, o, [&](int64_t i, T v) {
      const T d = v - mean[i];
      return d * d;
    });
    // Like torch, a divisor of zero or less gives inf or NaN rather than an error.
    const T divisor = static_cast<T>(std::max<int64_t>(0, b.reduced - correction));
    for (int64_t i = 0; i < out.numel(); ++i) o[i] /= divisor;
  });
  return out;
}

MaxResult max(const Tensor& x, int64_t dim, bool keepdim) {  // (*) -> (*r), (*r) i64
  if (is_half(x.dtype())) {  // exact: the maximum is one of x's values
    MaxResult r = cpu::max(widened(x), dim, keepdim);
    r.values = narrowed(r.values, x.dtype());
    return r;
  }
  std::vector<bool> mask(static_cast<size_t>(x.dim()), false);
  if (x.dim() > 0) mask[normalize_dim(dim, x.dim(), "max")] = true;
  const Shape shape = reduced_shape(x.shape(), mask, keepdim);
  MaxResult result{empty(shape, {x.dtype(), x.device()}), empty(shape, {DType::i64, x.device()})};
  dispatch_floating(x.dtype(), "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ReduceBlock b = reduce_block_layout(x, mask);
    reduce_max(b.data.data_ptr<T>(), b.outer, b.reduced, b.inner, result.values.data_ptr<T>(),
               result.indices.data_ptr<int64_t>());
  });
  return result;
}

}  // namespace tessera::kernels::cpu
