// Row-gather helpers of embedding.cu and index.cu: id checks, copy units, launch shapes.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda::gather {

// Calls f(TypeTag<I>{}) with I the C++ type of an i32 or i64 id tensor; `what` names the
// tensor in the error ("ids", "an index").
template <class F>
void dispatch_ids(DType dtype, const char* op, const char* what, F&& f) {
  switch (dtype) {
    case DType::i32:
      return f(TypeTag<int32_t>{});
    case DType::i64:
      return f(TypeTag<int64_t>{});
    default:
      TS_FAIL("[", op, "] expected ", what, " of dtype i32 or i64, found ", dtype_name(dtype));
  }
}

// Positions into the ids are i32 unless there are more than 2^31 - 1 of them: half the
// sort traffic in the common case.
template <class F>
void dispatch_positions(int64_t count, F&& f) {
  if (count <= INT32_MAX) return f(TypeTag<int32_t>{});
  return f(TypeTag<int64_t>{});
}

template <class P>
constexpr DType position_dtype() {
  return sizeof(P) == 4 ? DType::i32 : DType::i64;
}

// The smallest flat position of p whose value is outside [0, bound), recorded as
// tag | position into the deferred-check word (Note [Deferred device checks],
// core/cuda_runtime.h). A thread's grid-stride positions increase, so its first hit is its
// smallest.
template <class I>
__global__ void first_out_of_range_kernel(const I* __restrict__ p, int64_t n, int64_t bound,
                                          unsigned long long* word, uint64_t tag) {
  unsigned long long mine = ULLONG_MAX;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t v = static_cast<int64_t>(p[i]);
    if (v < 0 || v >= bound) {
      mine = static_cast<unsigned long long>(i);
      break;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, mine, o);
    mine = other < mine ? other : mine;
  }
  if (threadIdx.x % 32 == 0 && mine != ULLONG_MAX) atomicMin(word, tag | mine);
}

// Checks, without waiting for the device, that every value of the contiguous `values` is
// in [0, bound): the first one outside fails the next synchronizing read with the CPU
// kernel's message (kernels/cpu/index_range.h). The gather and scatter kernels skip such
// values meanwhile.
template <class I>
void check_range(const char* op, const char* what, const Tensor& values,
                 int64_t bound) {  // (...) contiguous
  const int64_t n = values.numel();
  if (n == 0) return;
  const int device = values.device().index;
  const uint64_t tag = ::tessera::cuda::defer_check(
      device, [op = std::string(op), what = std::string(what), values, bound](int64_t pos) {
        return str_cat("[", op, "] expected ", what, " in [0, ", bound, "), found ",
                       values.reshape({-1}).select(0, pos).item<int64_t>(), " at flat position ",
                       pos, " of ", what, " ", shape_str(values.shape()));
      });
  first_out_of_range_kernel<I><<<grid_for(n), kThreads, 0, kStream>>>(
      ptr<I>(values), n, bound, ::tessera::cuda::deferred_check_word(device), tag);
  check_launch(op);
}

// Largest power of two up to 16 that divides every value (byte counts and addresses): the
// widest word a row copy can move.
inline int copy_unit(std::initializer_list<uint64_t> values) {
  uint64_t bits = 16;
  for (uint64_t v : values) bits |= v;
  return static_cast<int>(bits & (~bits + 1));
}

// Calls f(TypeTag<U>{}) with U an unsigned word of `bytes` bytes (1, 2, 4, 8 or 16).
template <class F>
void dispatch_unit(int bytes, F&& f) {
  switch (bytes) {
    case 16:
      return f(TypeTag<uint4>{});
    case 8:
      return f(TypeTag<uint2>{});
    case 4:
      return f(TypeTag<uint32_t>{});
    case 2:
      return f(TypeTag<uint16_t>{});
    default:
      return f(TypeTag<uint8_t>{});
  }
}

// Launch shape for work on `rows` rows of `width` items: threadIdx.x walks a row (enough
// threads for it, up to kThreads), threadIdx.y picks one of the rows a block takes, and
// blockIdx.y splits rows wider than a block so a few wide rows still fill the device.
struct RowLaunch {
  dim3 grid;
  dim3 block;
};

inline RowLaunch row_launch(int64_t rows, int64_t width) {
  // Narrow rows get a power of two (several rows share a warp), wide ones whole warps.
  unsigned per_row = 1;
  while (per_row < width && per_row < 32) per_row *= 2;
  if (width > 32)
    per_row = static_cast<unsigned>(std::min<int64_t>(kThreads, (width + 31) / 32 * 32));
  const unsigned rows_per_block = kThreads / per_row;
  const int64_t chunks = std::min<int64_t>((width + per_row - 1) / per_row, 65535);
  return {dim3(grid_for(rows, static_cast<int>(rows_per_block)), static_cast<unsigned>(chunks)),
          dim3(per_row, rows_per_block)};
}

template <class P>
__global__ void iota_kernel(P* __restrict__ p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<P>(i);
  }
}

}  // namespace tessera::kernels::cuda::gather
