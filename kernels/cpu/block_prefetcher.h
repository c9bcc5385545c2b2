// BlockPrefetcher: brings a strided matrix block into L2 a few cache lines at a time, for
// the packed GEMM (kernels/cpu/sgemm.cc), which spreads the next B block's lines over the
// tiles of the current one.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/strided_matrix.h"

namespace tessera::kernels::cpu {

// Prefetches the cache lines of a (rows, cols) block, a few per call, in storage order: the
// next B block's source is brought into L2 while the tiles of the current block compute, so
// packing it does not wait on DRAM (the forward's weights). A block with no unit stride has
// nothing to prefetch.
class BlockPrefetcher {
 public:
  BlockPrefetcher() = default;
  template <class Src>
  BlockPrefetcher(StridedOf<Src> m, int64_t rows, int64_t cols) {
    constexpr auto kBytes = static_cast<int64_t>(sizeof(Src));
    if (m.col_stride == 1) {  // rows are the contiguous runs
      runs_ = rows;
      run_stride_ = m.row_stride * kBytes;
      run_end_ = cols * kBytes;
    } else if (m.row_stride == 1) {  // columns are
      runs_ = cols;
      run_stride_ = m.col_stride * kBytes;
      run_end_ = rows * kBytes;
    } else {
      return;
    }
    const auto address = reinterpret_cast<uintptr_t>(m.data);
    base_ = reinterpret_cast<const char*>(address & ~uintptr_t{kLine - 1});
    run_end_ += static_cast<int64_t>(address & (kLine - 1));  // bytes from base_'s line
  }

  // Cache lines in the block.
  int64_t lines() const { return runs_ * ((run_end_ + kLine - 1) / kLine); }

  // Prefetches the next `count` lines (fewer at the end of the block).
  void issue(int64_t count) {
    for (; count > 0 && run_ < runs_; --count) {
      _mm_prefetch(base_ + run_ * run_stride_ + offset_, _MM_HINT_T1);
      offset_ += kLine;
      if (offset_ >= run_end_) {
        offset_ = 0;
        ++run_;
      }
    }
  }

 private:
  static constexpr int64_t kLine = 64;
  const char* base_ = nullptr;
  int64_t runs_ = 0;        // contiguous runs
  int64_t run_stride_ = 0;  // bytes between runs
  int64_t run_end_ = 0;     // bytes in a run, counted from its first line's start
  int64_t run_ = 0;         // next line to prefetch: run and byte offset in it
  int64_t offset_ = 0;
};

}  // namespace tessera::kernels::cpu
