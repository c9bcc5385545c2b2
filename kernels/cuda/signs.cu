// CUDA sign-bit kernels with the CPU's layout (kernels/signs.h): a thread per byte (pack) or
// element (unpack), in grid-stride loops, since grid_for caps the grid.
#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

template <class T>
__global__ void __launch_bounds__(kThreads)
    pack_signs_kernel(const T* __restrict__ x, int64_t n, uint8_t* __restrict__ out,
                      int64_t bytes) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes;
       b += stride) {
    uint8_t byte = 0;
    for (int k = 0; k < 8; ++k) {
      const int64_t i = b * 8 + k;
      const bool bit = i < n && !(static_cast<float>(x[i]) < 0.0f);
      byte = static_cast<uint8_t>(byte | (bit ? 0x80u >> k : 0u));
    }
    out[b] = byte;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    unpack_signs_kernel(const uint8_t* __restrict__ bits, int64_t n, T* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = static_cast<T>((bits[i / 8] >> (7 - i % 8)) & 1 ? 1.0f : -1.0f);
  }
}

}  // namespace

Tensor pack_signs(const Tensor& x) {  // (n) contiguous floating -> (ceil(n / 8)) u8
  const int64_t n = x.numel();
  const int64_t bytes = (n + 7) / 8;
  Tensor out = empty({bytes}, {DType::u8, x.device()});
  if (bytes == 0) return out;
  set_device("pack_signs", x);
  dispatch_cuda_floating(x.dtype(), "pack_signs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    pack_signs_kernel<T>
        <<<grid_for(bytes), kThreads, 0, kStream>>>(ptr<const T>(x), n, ptr<uint8_t>(out), bytes);
  });
  check_launch("pack_signs");
  return out;
}

Tensor unpack_signs(const Tensor& bits, int64_t n, DType dtype) {  // -> (n) of +1 / -1
  Tensor out = empty({n}, {dtype, bits.device()});
  if (n == 0) return out;
  set_device("unpack_signs", bits);
  dispatch_cuda_floating(dtype, "unpack_signs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    unpack_signs_kernel<T>
        <<<grid_for(n), kThreads, 0, kStream>>>(ptr<const uint8_t>(bits), n, ptr<T>(out));
  });
  check_launch("unpack_signs");
  return out;
}

}  // namespace tessera::kernels::cuda
