// Device copies and fills behind core/cuda_runtime.h (Note [Device copies]).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/copy_kernel.h"
#include "core/error.h"
#include "core/half_bits.h"

namespace tessera::cuda {
namespace {

// Note [Device copies]
// A copy first merges dimensions that are contiguous in both operands and drops those of
// size 1, so most views become one contiguous run or a few strided runs. Then:
// - same dtype, both contiguous: cudaMemcpyAsync (the copy engines' bandwidth);
// - otherwise a kernel typed on (destination, source), so elements move as whole words and
//   conversions are inlined, with a grid-stride loop; the merged rank keeps the index
//   arithmetic short, and a contiguous pair needs none. A contiguous pair whose pointers
//   are aligned to kVec elements moves kVec elements a thread in vector accesses (an f32 to
//   bf16 cast of one element a thread ran at 34-47% of the copy bandwidth of an H100 and
//   an H200, its 2-byte stores the bound).
// Conversions equal the CPU's tessera::convert (core/dtype.h): 16-bit results rounded once
// (Note [Rounding once to 16 bits], core/half.h), floating values truncated to int64 before
// an integer of another width takes them.

constexpr int kMaxDims = 8;
constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements a thread of the vector copy moves at once

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
}

// ---- element types and conversions ---------------------------------------------------------

struct F16 {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

__device__ float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float mag = float(mant) * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// core/half.h's round_to_odd_float: double -> float such that rounding on to 16 bits is
// correct.
__device__ float round_to_odd_float(double d) {
  const float f = __double2float_rn(d);
  if (double(f) == d || d != d) return f;
  uint32_t u = __float_as_uint(f);
  if (fabs(double(f)) > fabs(d)) u -= 1;
  return __uint_as_float(u | 1u);
}

template <class T>
inline constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                 std::is_same_v<T, F16> || std::is_same_v<T, BF16>;

// The source value in the widest type that holds it exactly: float for f16/bf16, else itself.
template <class S>
__device__ auto widen(S s) {
  if constexpr (std::is_same_v<S, F16>) {
    return f16_to_float(s.bits);
  } else if constexpr (std::is_same_v<S, BF16>) {
    return __uint_as_float(uint32_t(s.bits) << 16);
  } else {
    return s;
  }
}

template <class D, class S>
__device__ D convert(S s) {
  const auto w = widen(s);
  using W = std::remove_const_t<decltype(w)>;  // decltype of a const auto keeps the const
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, F16> || std::is_same_v<D, BF16>) {
    float f;
    if constexpr (std::is_same_v<W, double> || std::is_same_v<W, int32_t> ||
                  std::is_same_v<W, int64_t>) {
      f = round_to_odd_float(double(w));
    } else {
      f = float(w);  // float, u8, bool: exact
    }
    return D{std::is_same_v<D, F16> ? float_to_f16_bits(f) : float_to_bf16_bits(f)};
  } else if constexpr (std::is_same_v<D, bool>) {
    return w != W(0);
  } else if constexpr (std::is_integral_v<D> && kIsFloat<S>) {
    return D(int64_t(w));
  } else {
    return D(w);
  }
}

// ---- kernels ---------------------------------------------------------------------------------

template <class D, class S>
__global__ void copy_contiguous_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = convert<D>(src[i]);
  }
}

// kVec elements of T, loaded and stored as whole vectors.
template <class T>
struct alignas(sizeof(T) * kVec) VecOf {
  T v[kVec];
};

// copy_contiguous_kernel for kVec-aligned dst and src: kVec elements a thread, the last
// n % kVec one a thread.
template <class D, class S>
__global__ void copy_contiguous_vec_kernel(D* __restrict__ dst, const S* __restrict__ src,
                                           int64_t n) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t vecs = n / kVec;
  const VecOf<S>* s = reinterpret_cast<const VecOf<S>*>(src);
  VecOf<D>* d = reinterpret_cast<VecOf<D>*>(dst);
  for (int64_t i = first; i < vecs; i += stride) {
    const VecOf<S> in = s[i];
    VecOf<D> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = convert<D>(in.v[k]);
    d[i] = out;
  }
  for (int64_t i = vecs * kVec + first; i < n; i += stride) dst[i] = convert<D>(src[i]);
}

// Whether p is aligned for VecOf<T> accesses.
template <class T>
bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % alignof(VecOf<T>) == 0;
}

// Merged dimensions; strides in elements.
struct Layout {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t dst_strides[kMaxDims];
  int64_t src_strides[kMaxDims];
};

template <class D, class S>
__global__ void copy_strided_kernel(D* __restrict__ dst, const S* __restrict__ src, Layout l,
                                    int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, d_off = 0, s_off = 0;
    for (int d = l.ndim - 1; d > 0; --d) {
      const int64_t idx = rem % l.shape[d];
      rem /= l.shape[d];
      d_off += idx * l.dst_strides[d];
      s_off += idx * l.src_strides[d];
    }
    d_off += rem * l.dst_strides[0];
    s_off += rem * l.src_strides[0];
    dst[d_off] = convert<D>(src[s_off]);
  }
}

// Calls f(T{}) with the device element type of `dtype` (order of core/dtype.h).
template <class F>
void with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f16:
      return f(F16{});
    case DType::bf16:
      return f(BF16{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::u8:
      return f(uint8_t{});
    case DType::boolean:
      return f(bool{});
  }
  TS_FAIL("[copy_] unknown dtype ", static_cast<int>(dtype));
}

// Drops size-1 dimensions and merges neighbours contiguous in both operands; n > 0.
Layout merge_dims(const Shape& shape, const Strides& dst, const Strides& src) {
  Layout l{};
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (l.ndim > 0) {
      const int last = l.ndim - 1;
      if (l.dst_strides[last] == dst[d] * shape[d] && l.src_strides[last] == src[d] * shape[d]) {
        l.shape[last] *= shape[d];
        l.dst_strides[last] = dst[d];
        l.src_strides[last] = src[d];
        continue;
      }
    }
    l.shape[l.ndim] = shape[d];
    l.dst_strides[l.ndim] = dst[d];
    l.src_strides[l.ndim] = src[d];
    ++l.ndim;
  }
  if (l.ndim == 0) {  // a single element
    l.ndim = 1;
    l.shape[0] = 1;
    l.dst_strides[0] = l.src_strides[0] = 1;
  }
  return l;
}

// ---- fills -----------------------------------------------------------------------------------

// Contiguous fill with one element of `value`'s width per index.
template <class W>
__global__ void fill_contiguous_kernel(W* __restrict__ dst, W value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

template <class W>
__global__ void fill_strided_kernel(W* __restrict__ dst, W value, Layout l, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = 0;
    for (int d = l.ndim - 1; d > 0; --d) {
      off += (rem % l.shape[d]) * l.dst_strides[d];
      rem /= l.shape[d];
    }
    dst[off + rem * l.dst_strides[0]] = value;
  }
}

template <class W>
void fill_words(void* dst, uint64_t pattern, const Layout& l, int64_t n) {
  W* d = static_cast<W*>(dst);
  const W value = static_cast<W>(pattern);
  if (l.ndim == 1 && l.dst_strides[0] == 1) {
    fill_contiguous_kernel<W><<<blocks_for(n), kThreads>>>(d, value, n);
  } else {
    fill_strided_kernel<W><<<blocks_for(n), kThreads>>>(d, value, l, n);
  }
}

}  // namespace

void launch_copy_strided(const StridedView& dst, const StridedView& src, const Shape& shape) {
  TS_CHECK(shape.size() <= kMaxDims, "[copy_] CUDA copies support up to ", kMaxDims,
           " dims, found ", shape.size());
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  if (n == 0) return;
  const Layout l = merge_dims(shape, dst.strides, src.strides);
  const bool contiguous = l.ndim == 1 && l.dst_strides[0] == 1 && l.src_strides[0] == 1;
  if (contiguous && dst.dtype == src.dtype) {
    TS_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(n) * itemsize(dst.dtype),
                             cudaMemcpyDeviceToDevice, 0) == cudaSuccess,
             "[copy_] cudaMemcpyAsync of ", n, " elements failed");
    return;
  }
  with_type(dst.dtype, [&](auto d_tag) {
    using D = decltype(d_tag);
    with_type(src.dtype, [&](auto s_tag) {
      using S = decltype(s_tag);
      D* d = static_cast<D*>(dst.data);
      const S* s = static_cast<const S*>(src.data);
      if (contiguous && vec_aligned<D>(d) && vec_aligned<S>(s)) {
        copy_contiguous_vec_kernel<D, S><<<blocks_for(n / kVec + 1), kThreads>>>(d, s, n);
      } else if (contiguous) {
        copy_contiguous_kernel<D, S><<<blocks_for(n), kThreads>>>(d, s, n);
      } else {
        copy_strided_kernel<D, S><<<blocks_for(n), kThreads>>>(d, s, l, n);
      }
    });
  });
}

void launch_fill(const StridedView& dst, const Shape& shape, uint64_t pattern) {
  TS_CHECK(shape.size() <= kMaxDims, "[fill_] CUDA fills support up to ", kMaxDims, " dims, found ",
           shape.size());
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  if (n == 0) return;
  const Layout l = merge_dims(shape, dst.strides, dst.strides);
  const size_t bytes = itemsize(dst.dtype);
  if (l.ndim == 1 && l.dst_strides[0] == 1 && pattern == 0) {
    TS_CHECK(cudaMemsetAsync(dst.data, 0, static_cast<size_t>(n) * bytes, 0) == cudaSuccess,
             "[fill_] cudaMemsetAsync of ", n, " elements failed");
    return;
  }
  switch (bytes) {
    case 1:
      return fill_words<uint8_t>(dst.data, pattern, l, n);
    case 2:
      return fill_words<uint16_t>(dst.data, pattern, l, n);
    case 4:
      return fill_words<uint32_t>(dst.data, pattern, l, n);
    default:
      return fill_words<uint64_t>(dst.data, pattern, l, n);
  }
}

}  // namespace tessera::cuda
