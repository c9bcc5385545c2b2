#include <algorithm>
#include <cstdint>

#include "core/cuda/copy_kernel.h"
#include "core/error.h"

namespace tessera::cuda {
namespace {

constexpr int kMaxDims = 8;

struct CopyArgs {
  char* dst;
  const char* src;
  int ndim;
  int64_t shape[kMaxDims];
  int64_t dst_strides[kMaxDims];  // bytes
  int64_t src_strides[kMaxDims];  // bytes
  int dst_dtype;
  int src_dtype;
  int same_dtype_bytes;  // itemsize when both dtypes match (raw copy), else 0
};

__device__ float half_to_float(uint16_t h) {
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

__device__ uint16_t float_to_half(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    const float shifted = __uint_as_float(abs) + 0.5f;
    return uint16_t(sign | (__float_as_uint(shifted) - 0x3f000000u));
  }
  const uint32_t rounded = abs + 0xc8000fffu + ((abs >> 13) & 1u);
  return uint16_t(sign | (rounded >> 13));
}

__device__ uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// DType order of core/dtype.h: f32, f16, bf16, f64, i32, i64, u8, bool.
__device__ double load(const char* p, int dtype) {
  switch (dtype) {
    case 0:
      return *reinterpret_cast<const float*>(p);
    case 1:
      return half_to_float(*reinterpret_cast<const uint16_t*>(p));
    case 2:
      return __uint_as_float(uint32_t(*reinterpret_cast<const uint16_t*>(p)) << 16);
    case 3:
      return *reinterpret_cast<const double*>(p);
    case 4:
      return *reinterpret_cast<const int32_t*>(p);
    case 5:
      return double(*reinterpret_cast<const int64_t*>(p));
    case 6:
      return *reinterpret_cast<const uint8_t*>(p);
    default:
      return *reinterpret_cast<const uint8_t*>(p) != 0 ? 1.0 : 0.0;
  }
}

__device__ void store(char* p, int dtype, double v) {
  switch (dtype) {
    case 0:
      *reinterpret_cast<float*>(p) = float(v);
      break;
    case 1:
      *reinterpret_cast<uint16_t*>(p) = float_to_half(float(v));
      break;
    case 2:
      *reinterpret_cast<uint16_t*>(p) = float_to_bf16(float(v));
      break;
    case 3:
      *reinterpret_cast<double*>(p) = v;
      break;
    case 4:
      *reinterpret_cast<int32_t*>(p) = int32_t(v);
      break;
    case 5:
      *reinterpret_cast<int64_t*>(p) = int64_t(v);
      break;
    case 6:
      *reinterpret_cast<uint8_t*>(p) = uint8_t(v);
      break;
    default:
      *reinterpret_cast<uint8_t*>(p) = v != 0.0;
      break;
  }
}

__global__ void copy_strided_kernel(CopyArgs a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, d_off = 0, s_off = 0;
    for (int d = a.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % a.shape[d];
      rem /= a.shape[d];
      d_off += idx * a.dst_strides[d];
      s_off += idx * a.src_strides[d];
    }
    if (a.same_dtype_bytes) {
      for (int b = 0; b < a.same_dtype_bytes; ++b) a.dst[d_off + b] = a.src[s_off + b];
    } else {
      store(a.dst + d_off, a.dst_dtype, load(a.src + s_off, a.src_dtype));
    }
  }
}

// Contiguous fill with one element of `value`'s width per index.
template <class W>
__global__ void fill_contiguous_kernel(W* __restrict__ dst, W value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

struct FillArgs {
  char* dst;
  int ndim;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];  // bytes
  int bytes;                  // itemsize: 1, 2, 4 or 8
  uint64_t pattern;
};

__global__ void fill_strided_kernel(FillArgs a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = 0;
    for (int d = a.ndim - 1; d >= 0; --d) {
      off += (rem % a.shape[d]) * a.strides[d];
      rem /= a.shape[d];
    }
    char* p = a.dst + off;
    switch (a.bytes) {
      case 1:
        *reinterpret_cast<uint8_t*>(p) = uint8_t(a.pattern);
        break;
      case 2:
        *reinterpret_cast<uint16_t*>(p) = uint16_t(a.pattern);
        break;
      case 4:
        *reinterpret_cast<uint32_t*>(p) = uint32_t(a.pattern);
        break;
      default:
        *reinterpret_cast<uint64_t*>(p) = a.pattern;
        break;
    }
  }
}

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
}

template <class W>
void fill_contiguous(void* dst, uint64_t pattern, int64_t n) {
  fill_contiguous_kernel<W>
      <<<blocks_for(n), kThreads>>>(static_cast<W*>(dst), static_cast<W>(pattern), n);
}

}  // namespace

void launch_fill(const StridedView& dst, const Shape& shape, uint64_t pattern) {
  TS_CHECK(shape.size() <= kMaxDims, "[fill_] CUDA fills support up to ", kMaxDims,
           " dims, found ", shape.size());
  const int bytes = static_cast<int>(itemsize(dst.dtype));
  int64_t n = 1, expected_stride = 1;
  bool contiguous = true;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && dst.strides[d] != expected_stride) contiguous = false;
    expected_stride *= shape[d];
    n *= shape[d];
  }
  if (n == 0) return;
  if (contiguous && pattern == 0) {
    TS_CHECK(cudaMemsetAsync(dst.data, 0, static_cast<size_t>(n) * bytes, 0) == cudaSuccess,
             "[fill_] cudaMemsetAsync failed");
  } else if (contiguous) {
    switch (bytes) {
      case 1:
        fill_contiguous<uint8_t>(dst.data, pattern, n);
        break;
      case 2:
        fill_contiguous<uint16_t>(dst.data, pattern, n);
        break;
      case 4:
        fill_contiguous<uint32_t>(dst.data, pattern, n);
        break;
      default:
        fill_contiguous<uint64_t>(dst.data, pattern, n);
        break;
    }
  } else {
    FillArgs a{};
    a.dst = static_cast<char*>(dst.data);
    a.ndim = static_cast<int>(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      a.shape[d] = shape[d];
      a.strides[d] = dst.strides[d] * bytes;
    }
    a.bytes = bytes;
    a.pattern = pattern;
    fill_strided_kernel<<<blocks_for(n), kThreads>>>(a, n);
  }
}

void launch_copy_strided(const StridedView& dst, const StridedView& src, const Shape& shape) {
  TS_CHECK(shape.size() <= kMaxDims, "[copy_] CUDA copies support up to ", kMaxDims,
           " dims, found ", shape.size());
  CopyArgs a{};
  a.dst = static_cast<char*>(dst.data);
  a.src = static_cast<const char*>(src.data);
  a.ndim = static_cast<int>(shape.size());
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    a.shape[d] = shape[d];
    a.dst_strides[d] = dst.strides[d] * static_cast<int64_t>(itemsize(dst.dtype));
    a.src_strides[d] = src.strides[d] * static_cast<int64_t>(itemsize(src.dtype));
    n *= shape[d];
  }
  a.dst_dtype = static_cast<int>(dst.dtype);
  a.src_dtype = static_cast<int>(src.dtype);
  a.same_dtype_bytes = dst.dtype == src.dtype ? static_cast<int>(itemsize(dst.dtype)) : 0;
  if (n == 0) return;
  copy_strided_kernel<<<blocks_for(n), kThreads>>>(a, n);
}

}  // namespace tessera::cuda
