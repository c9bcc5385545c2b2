// Launching an elementwise function over operands broadcast to one output shape: a part of
// kernels/cuda/elementwise.cu, the one file that includes it (hence its unnamed namespace).
//
// Note [Elementwise layouts on the device]
// Each op maps one function over the output's elements. The operands, broadcast to the
// output shape through make_indexer, are coalesced jointly into a Layout: size-1 dims
// dropped and adjacent dims merged where every operand allows. When every operand ends up
// contiguous (one dim of stride 1) and aligned, a dense kernel reads them with 16-byte
// vector loads; otherwise one set of divisions per element gives the offsets of all
// operands. A broadcast scalar or a plain strided 1-D operand coalesces to one dim and
// needs no division at all.
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda {
namespace {

// N operands broadcast to one output shape, coalesced (Note [Elementwise layouts on the
// device]); strides in elements.
template <int N>
struct Layout {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  // Offsets of every operand's element at the output's row-major index `linear`. I is
  // uint32_t when the output has fewer than 2^32 elements: 32-bit divisions cost a
  // fraction of 64-bit ones, which would otherwise bound these memory-bound kernels.
  template <class I>
  __device__ __forceinline__ void offsets(I linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d > 0; --d) {
      if (d >= ndim) continue;
      const I size = static_cast<I>(sizes[d]);
      const I q = linear / size;
      const int64_t r = static_cast<int64_t>(linear - q * size);
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
      linear = q;
    }
    // The outermost dim needs no modulo: linear < sizes[0] there.
    if (ndim > 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(linear) * strides[k][0];
    }
  }

  // True when every operand reads element i at offset i.
  bool dense() const {
    if (ndim == 0) return true;
    if (ndim > 1) return false;
    for (int k = 0; k < N; ++k) {
      if (strides[k][0] != 1) return false;
    }
    return true;
  }
};

template <int N>
Layout<N> make_layout(const char* op, const std::array<Tensor, N>& ts, const Shape& shape) {
  Indexer ix[N];
  // detach: make_indexer's expand is a raw view, which throws on a tensor that requires
  // grad while grad mode is on (forward kernels see such tensors).
  for (int k = 0; k < N; ++k) ix[k] = make_indexer(op, ts[k].detach(), shape);
  Layout<N> l;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t size = shape[d];
    if (size == 1) continue;
    if (l.ndim > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        merge = merge && l.strides[k][l.ndim - 1] == ix[k].strides[d] * size;
      if (merge) {
        l.sizes[l.ndim - 1] *= size;
        for (int k = 0; k < N; ++k) l.strides[k][l.ndim - 1] = ix[k].strides[d];
        continue;
      }
    }
    l.sizes[l.ndim] = size;
    for (int k = 0; k < N; ++k) l.strides[k][l.ndim] = ix[k].strides[d];
    ++l.ndim;
  }
  return l;
}

// Whether every index below n fits Layout::offsets's 32-bit path.
bool fits_u32(int64_t n) { return n <= int64_t{UINT32_MAX}; }

template <class T, int N>
struct Ptrs {
  const T* p[N];
};

template <int N, class T, class F>
__device__ __forceinline__ auto call(const F& f, const T (&v)[N]) {
  if constexpr (N == 1) {
    return f(v[0]);
  } else {
    static_assert(N == 2);
    return f(v[0], v[1]);
  }
}

template <int VEC, class T, class Out, int N, class F>
__global__ void __launch_bounds__(kThreads)
    dense_map_kernel(Out* __restrict__ out, Ptrs<T, N> in, int64_t n, F f) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t k = first; k < packs; k += stride) {
    Pack<T, VEC> a[N];
#pragma unroll
    for (int j = 0; j < N; ++j) a[j] = reinterpret_cast<const Pack<T, VEC>*>(in.p[j])[k];
    Pack<Out, VEC> o;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      T v[N];
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] = a[j].v[e];
      o.v[e] = call<N>(f, v);
    }
    reinterpret_cast<Pack<Out, VEC>*>(out)[k] = o;
  }
  for (int64_t i = packs * VEC + first; i < n; i += stride) {
    T v[N];
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = in.p[j][i];
    out[i] = call<N>(f, v);
  }
}

// I: the index type of Layout::offsets.
template <class I, class T, class Out, int N, class F>
__global__ void __launch_bounds__(kThreads)
    strided_map_kernel(Out* __restrict__ out, Ptrs<T, N> in, Layout<N> layout, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int64_t off[N];
    layout.offsets(static_cast<I>(i), off);
    T v[N];
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = in.p[j][off[j]];
    out[i] = call<N>(f, v);
  }
}

// out[i] = f(in[0][i], ...) over out's shape, `in` broadcast to it; out is new and
// contiguous, on the current device.
template <class T, class Out, int N, class F>
void launch_map(const char* op, const Tensor& out, const std::array<Tensor, N>& in, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Layout<N> layout = make_layout<N>(op, in, out.shape());
  Ptrs<T, N> p;
  for (int k = 0; k < N; ++k) p.p[k] = ptr<const T>(in[k]);
  Out* o = ptr<Out>(out);
  constexpr int kVec = vec_of<T>();
  bool vectorize = layout.dense() && n >= kVec && aligned_for<Out, kVec>(o);
  for (int k = 0; k < N; ++k) vectorize = vectorize && aligned_for<T, kVec>(p.p[k]);
  if (vectorize) {
    dense_map_kernel<kVec><<<grid_for(n / kVec), kThreads, 0, kStream>>>(o, p, n, f);
  } else if (fits_u32(n)) {
    // A dense layout left unaligned has one dim here: offsets need no division.
    strided_map_kernel<uint32_t><<<grid_for(n), kThreads, 0, kStream>>>(o, p, layout, n, f);
  } else {
    strided_map_kernel<uint64_t><<<grid_for(n), kThreads, 0, kStream>>>(o, p, layout, n, f);
  }
  check_launch(op);
}

}  // namespace
}  // namespace tessera::kernels::cuda
