// Visiting every element of K strided operands of one shape, row by row.
//
// The plan merges dims that are contiguous for every operand and drops size-1 dims, so a
// contiguous tensor of any rank becomes one row. Kernels write the inner loop over a span
// of a row and get broadcasting (stride 0) and non-contiguous views for free. Rows are cut
// into spans of at most kSpanLength elements so that one long contiguous row still splits
// across threads and per-span temporaries stay in cache.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/parallel.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace tessera {

template <size_t K>
struct LoopPlan {
  Shape shape;                          // coalesced dims, innermost last; never empty
  std::array<Strides, K> byte_strides;  // per operand, same rank as `shape`
};

// `strides` are in elements, `itemsizes` in bytes; all operands have `shape`.
template <size_t K>
LoopPlan<K> plan_loop(const Shape& shape, const std::array<Strides, K>& strides,
                      const std::array<int64_t, K>& itemsizes) {
  LoopPlan<K> plan;
  // Walk from the innermost dim outwards, merging dim d into the current run when every
  // operand steps through it exactly as through one longer inner dim.
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    bool merge = !plan.shape.empty();
    for (size_t k = 0; merge && k < K; ++k) {
      merge = strides[k][i] * itemsizes[k] == plan.byte_strides[k].front() * plan.shape.front();
    }
    if (merge) {
      plan.shape.front() *= shape[i];
      continue;
    }
    plan.shape.insert(plan.shape.begin(), shape[i]);
    for (size_t k = 0; k < K; ++k) {
      plan.byte_strides[k].insert(plan.byte_strides[k].begin(), strides[k][i] * itemsizes[k]);
    }
  }
  if (plan.shape.empty()) {
    plan.shape.push_back(numel_of(shape) == 0 ? 0 : 1);
    for (size_t k = 0; k < K; ++k) plan.byte_strides[k].push_back(itemsizes[k]);
  }
  return plan;
}

inline constexpr int64_t kSpanLength = 8192;

// Calls span(ptrs, n, inner_byte_strides) over every element of the plan, n <= kSpanLength;
// each thread gets at least `grain` elements.
template <size_t K, class Span>
void for_each_span(const LoopPlan<K>& plan, const std::array<char*, K>& base, Span&& span,
                   int64_t grain = 32768) {
  const int64_t ndim = static_cast<int64_t>(plan.shape.size());
  const int64_t inner = plan.shape.back();
  if (inner == 0) return;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) rows *= plan.shape[d];
  const int64_t pieces = (inner + kSpanLength - 1) / kSpanLength;
  const int64_t piece_length = std::min(inner, kSpanLength);
  std::array<int64_t, K> inner_strides;
  for (size_t k = 0; k < K; ++k) inner_strides[k] = plan.byte_strides[k].back();
  const int64_t task_grain = std::max<int64_t>(1, grain / piece_length);
  parallel_for(rows * pieces, task_grain, [&](int64_t t0, int64_t t1) {
    // Multi-index over the outer dims of the row that task t0 falls in.
    Shape idx(static_cast<size_t>(std::max<int64_t>(ndim - 1, 0)), 0);
    int64_t rem = t0 / pieces;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      idx[d] = rem % plan.shape[d];
      rem /= plan.shape[d];
    }
    std::array<char*, K> row;
    for (size_t k = 0; k < K; ++k) {
      row[k] = base[k];
      for (int64_t d = 0; d + 1 < ndim; ++d) row[k] += idx[d] * plan.byte_strides[k][d];
    }
    int64_t piece = t0 % pieces;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t begin = piece * kSpanLength;
      std::array<char*, K> ptrs;
      for (size_t k = 0; k < K; ++k) ptrs[k] = row[k] + begin * inner_strides[k];
      span(ptrs, std::min(kSpanLength, inner - begin), inner_strides);
      if (++piece < pieces) continue;
      piece = 0;
      // Advance the outer multi-index by one row.
      for (int64_t d = ndim - 2; d >= 0; --d) {
        for (size_t k = 0; k < K; ++k) row[k] += plan.byte_strides[k][d];
        if (++idx[d] < plan.shape[d]) break;
        for (size_t k = 0; k < K; ++k) row[k] -= plan.byte_strides[k][d] * plan.shape[d];
        idx[d] = 0;
      }
    }
  });
}

// for_each_span over tensors that all have the shape of ts[0] (expand operands first).
template <size_t K, class Span>
void for_each_span(const std::array<Tensor, K>& ts, Span&& span, int64_t grain = 32768) {
  std::array<Strides, K> strides;
  std::array<int64_t, K> itemsizes;
  std::array<char*, K> base;
  for (size_t k = 0; k < K; ++k) {
    strides[k] = ts[k].strides();
    itemsizes[k] = static_cast<int64_t>(ts[k].itemsize());
    base[k] = static_cast<char*>(ts[k].raw_data());
  }
  for_each_span<K>(plan_loop<K>(ts[0].shape(), strides, itemsizes), base, span, grain);
}

}  // namespace tessera
