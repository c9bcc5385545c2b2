// Block-per-row helpers of softmax.cu, layer_norm.cu and cross_entropy.cu: packed row access.
//
// Note [Row kernels]
// A block owns a row at a time (grid-stride over rows) and sizes itself to the row, up to
// kMaxRowThreads. Rows are read in 16-byte packs when every pointer of the row has the same
// offset from a 16-byte boundary (a scalar head reaches the boundary, a scalar tail ends
// the row), otherwise element by element. Each thread accumulates its elements in order
// and the block combines threads in a fixed tree (block_sum), so results are reproducible.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda::rows {

inline constexpr int kMaxRowThreads = 256;
inline constexpr int64_t kMaxGrid = 65535 * 8;  // blocks per launch; grid-stride loops do the rest

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }

// A pack seen as one uint4, so that the compiler emits one 16-byte load or store.
template <class T, int N>
union PackBits {
  uint4 bits;
  Pack<T, N> pack;
};

template <class T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  PackBits<T, N> u;
  u.bits = __ldg(reinterpret_cast<const uint4*>(p));
  return u.pack;
}

template <class T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  PackBits<T, N> u;
  u.pack = v;
  // __stwb is an ordinary store; a plain uint4 assignment was split into 4-byte stores.
  __stwb(reinterpret_cast<uint4*>(p), u.bits);
}

// Elements before the first 16-byte boundary at or after p, or all n when the row cannot
// be read in packs (the other pointers sit at another offset from a boundary).
template <class T>
__device__ __forceinline__ int64_t head_of(const T* p, bool same_offset, int64_t n) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(p) % 16;
  if (!same_offset) return n;
  return offset == 0 ? 0 : imin(n, static_cast<int64_t>((16 - offset) / sizeof(T)));
}

template <class T>
__device__ __forceinline__ bool same_offset(const T* a, const T* b) {
  return b == nullptr || reinterpret_cast<uintptr_t>(a) % 16 == reinterpret_cast<uintptr_t>(b) % 16;
}

// Calls fn(j, a[j], b[j]) (b[j] read as 0 when b is null) for the j < n this thread owns
// (Note [Row kernels]).
template <class T, class F>
__device__ __forceinline__ void visit_row(const T* a, const T* b, int64_t n, F&& fn) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  const int64_t head = head_of(a, same_offset(a, b), n);
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j]));
  }
  const int64_t packs = (n - head) / N;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const int64_t j = head + k * N;
    const Pack<T, N> pa = load_pack<T, N>(a + j);
    Pack<T, N> pb{};
    if (b != nullptr) pb = load_pack<T, N>(b + j);
#pragma unroll
    for (int i = 0; i < N; ++i) fn(j + i, to_acc(pa.v[i]), b == nullptr ? A(0) : to_acc(pb.v[i]));
  }
  for (int64_t j = head + packs * N + threadIdx.x; j < n; j += blockDim.x) {
    fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j]));
  }
}

// out[j] = fn(j, a[j], b[j]) for the j < n this thread owns, as visit_row.
template <class T, class F>
__device__ __forceinline__ void map_row(const T* a, const T* b, T* out, int64_t n, F&& fn) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  const int64_t head = head_of(a, same_offset(a, b) && same_offset<T>(a, out), n);
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    out[j] = from_acc<T>(fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j])));
  }
  const int64_t packs = (n - head) / N;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const int64_t j = head + k * N;
    const Pack<T, N> pa = load_pack<T, N>(a + j);
    Pack<T, N> pb{};
    if (b != nullptr) pb = load_pack<T, N>(b + j);
    Pack<T, N> po;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      po.v[i] = from_acc<T>(fn(j + i, to_acc(pa.v[i]), b == nullptr ? A(0) : to_acc(pb.v[i])));
    }
    store_pack(out + j, po);
  }
  for (int64_t j = head + packs * N + threadIdx.x; j < n; j += blockDim.x) {
    out[j] = from_acc<T>(fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j])));
  }
}

// Threads of a block that owns rows of `cols` elements: one per 16-byte pack, rounded to
// whole warps, at most kMaxRowThreads.
template <class T>
int row_threads(int64_t cols) {
  const int64_t packs = (cols + 16 / sizeof(T) - 1) / (16 / sizeof(T));
  return static_cast<int>(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, kMaxRowThreads));
}

inline unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxGrid)); }

// Running maximum and sum of exp(v - max) of one thread's elements.
//
// Note [Infinite logits]
// An element equal to the running maximum adds exactly 1, even at -inf: a row whose
// elements so far are all -inf counts them, and they vanish (times exp(-inf) = 0) once a
// finite maximum arrives. A row of only -inf gets the sum NaN, and a +inf element makes the
// sum NaN, as the CPU's two passes (sum of exp(x - max)) do.
template <class A>
struct MaxSum {
  A max = A(-INFINITY);
  A sum = A(0);

  __device__ __forceinline__ void add(A v) {
    if (v > max) {
      sum *= exp_acc(max - v);
      max = v;
    }
    // A NaN v is never the maximum and adds NaN.
    sum += v != max ? exp_acc(v - max) : v == A(INFINITY) ? A(NAN) : A(1);
  }
};

// The block's maximum and its sum of exp(x - maximum) from every thread's MaxSum.
template <class A>
__device__ __forceinline__ MaxSum<A> block_max_sum(MaxSum<A> mine, A* scratch) {
  MaxSum<A> all;
  all.max = block_max(mine.max, scratch);
  const A scale = mine.max == all.max ? A(1) : exp_acc(mine.max - all.max);
  all.sum = block_sum(mine.sum * scale, scratch);
  if (all.max == A(-INFINITY)) all.sum = A(NAN);  // Note [Infinite logits]
  return all;
}

template <class T>
constexpr DType acc_dtype() {
  return std::is_same_v<acc_t<T>, double> ? DType::f64 : DType::f32;
}

}  // namespace tessera::kernels::cuda::rows
