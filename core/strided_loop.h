// Visiting every element of K strided operands of one shape, row by row.
//
// The plan merges dims that are contiguous for every operand and drops size-1 dims, so a
// contiguous tensor of any rank becomes one row. Kernels write the inner loop over a row
// and get broadcasting (stride 0) and non-contiguous views for free.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/parallel.h"
#include "core/shape.h"

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

// Calls row(ptrs, n, inner_byte_strides) for every innermost row, rows split across
// threads so that each chunk covers at least `grain` elements.
template <size_t K, class Row>
void for_each_row(const LoopPlan<K>& plan, const std::array<char*, K>& base, Row&& row,
                  int64_t grain = 32768) {
  const int64_t ndim = static_cast<int64_t>(plan.shape.size());
  const int64_t inner = plan.shape.back();
  if (inner == 0) return;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) rows *= plan.shape[d];
  std::array<int64_t, K> inner_strides;
  for (size_t k = 0; k < K; ++k) inner_strides[k] = plan.byte_strides[k].back();
  const int64_t row_grain = std::max<int64_t>(1, grain / std::max<int64_t>(inner, 1));
  parallel_for(rows, row_grain, [&](int64_t r0, int64_t r1) {
    // Multi-index of row r0 over the outer dims.
    Shape idx(static_cast<size_t>(std::max<int64_t>(ndim - 1, 0)), 0);
    int64_t rem = r0;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      idx[d] = rem % plan.shape[d];
      rem /= plan.shape[d];
    }
    std::array<char*, K> ptrs;
    for (size_t k = 0; k < K; ++k) {
      ptrs[k] = base[k];
      for (int64_t d = 0; d + 1 < ndim; ++d) ptrs[k] += idx[d] * plan.byte_strides[k][d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      row(ptrs, inner, inner_strides);
      // Advance the outer multi-index by one row.
      for (int64_t d = ndim - 2; d >= 0; --d) {
        for (size_t k = 0; k < K; ++k) ptrs[k] += plan.byte_strides[k][d];
        if (++idx[d] < plan.shape[d]) break;
        for (size_t k = 0; k < K; ++k) ptrs[k] -= plan.byte_strides[k][d] * plan.shape[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace tessera
