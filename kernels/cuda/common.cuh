// What every CUDA kernel file shares: the compute stream, launch checks, the floating
// dtype switch, conversions to the accumulation type, strided indexing and block
// reductions. Included by kernels/cuda/*.cu and *.cc only (nvcc or the CUDA headers).
//
// Note [One compute stream]
// Every kernel, cuBLASLt call and copy of a device runs on the legacy default stream of
// that device, the way PyTorch's default stream works. Work is ordered by issue order,
// so the caching allocator may hand a block freed on the host to the next kernel without
// events, and cudaMemcpy to the host sees every earlier kernel's results. Communicators
// with their own streams (NCCL) make those streams wait on it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace tessera::kernels::cuda {

constexpr cudaStream_t kStream = 0;  // see Note [One compute stream]
constexpr int kThreads = 256;        // default block size of elementwise kernels
constexpr int kMaxDims = 8;          // highest tensor rank the strided kernels index

// N consecutive elements of T, loaded and stored as one vector access (16 bytes at most).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements of T per 16-byte vector access (every dtype is at most 8 bytes).
template <class T>
__host__ __device__ constexpr int vec_of() {
  return static_cast<int>(16 / sizeof(T));
}

// Whether `p` allows VEC-element vector accesses of T (a Pack<T, VEC>).
template <class T, int VEC>
bool aligned_for(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * VEC) == 0;
}

// Throws "[op] <call> failed: <name> (<text>)" unless `status` is cudaSuccess.
inline void check_cuda(cudaError_t status, const char* op, const char* call) {
  TS_CHECK(status == cudaSuccess, "[", op, "] ", call, " failed: ", cudaGetErrorName(status), " (",
           cudaGetErrorString(status), ")");
}

// Throws when the last kernel launch failed (bad configuration, no device, ...).
inline void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

// Makes `t`'s device current for the launches that follow.
inline void set_device(const char* op, const Tensor& t) {
  check_cuda(cudaSetDevice(t.device().index), op, "cudaSetDevice");
}

// Grid size for a grid-stride loop over n elements, capped so huge tensors loop.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// The element type `T` of a tensor as a pointer (no dtype check: the caller dispatched).
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// ---- Accumulation types and conversions -------------------------------------------
// Half types compute in float; f32 in float; f64 in double.
template <class T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <class T>
using acc_t = typename AccType<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounds to nearest even, as core/half.h does on the host.
template <class T>
__device__ __forceinline__ T from_acc(acc_t<T> v);
template <>
__device__ __forceinline__ float from_acc<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ double from_acc<double>(double v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_acc<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- The floating dtype switch ----------------------------------------------------
template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the device type of `dtype` (float, double, __half,
// __nv_bfloat16); any other dtype is an error naming the op. Not named dispatch_floating:
// argument-dependent lookup on DType would also find core/dispatch.h's.
template <class F>
decltype(auto) dispatch_cuda_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(TypeTag<float>{});
    case DType::f64:
      return f(TypeTag<double>{});
    case DType::f16:
      return f(TypeTag<__half>{});
    case DType::bf16:
      return f(TypeTag<__nv_bfloat16>{});
    default:
      TS_FAIL("[", op, "] expected a floating dtype (f32, f64, f16, bf16), found ",
              dtype_name(dtype));
  }
}

// ---- Strided indexing -------------------------------------------------------------
// Maps the linear row-major index of an element of `sizes` to an element offset through
// `strides`; a broadcast dimension has stride 0. Passed to kernels by value.
struct Indexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  __device__ __forceinline__ int64_t operator()(int64_t linear) const {
    int64_t offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      offset += i * strides[d];
    }
    return offset;
  }
};

// The indexer of `t` broadcast to `shape` (stride 0 along broadcast dimensions).
inline Indexer make_indexer(const char* op, const Tensor& t, const Shape& shape) {
  TS_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "[", op, "] CUDA kernels index at most ",
           kMaxDims, " dimensions, found ", shape.size());
  const Tensor view = t.shape() == shape ? t : t.detach().expand(shape);  // a raw view
  Indexer ix;
  ix.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < ix.ndim; ++d) {
    ix.sizes[d] = shape[d];
    ix.strides[d] = view.strides()[d];
  }
  return ix;
}

// ---- Reductions -------------------------------------------------------------------
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_max(T v) {
  // ::max, not max: kernels.h declares cuda::max(const Tensor&, ...), which would hide it.
  for (int o = 16; o > 0; o >>= 1) v = ::max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of `v` over the block, returned to every thread. `scratch` holds 32 values in
// shared memory; blockDim.x is a multiple of 32. Synchronizes the block.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  T total = lane < warps ? scratch[lane] : T(0);
  return warp_sum(total);
}

// Maximum of `v` over the block, returned to every thread (as block_sum).
template <class T>
__device__ T block_max(T v, T* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  T m = lane < warps ? scratch[lane] : scratch[0];
  return warp_max(m);
}

}  // namespace tessera::kernels::cuda
