// f16 and bf16 on the CPU: math in f32 between one widening and one rounding.
//
// Note [16-bit math on the CPU]
// Every CPU kernel takes f16 and bf16 tensors with the semantics of the CUDA kernels: the
// 16-bit operands are widened to f32 (exactly), every product, sum and transcendental is
// computed and accumulated in f32, and each 16-bit result is rounded once, to nearest even,
// from its f32 value. Row statistics and losses (layer-norm mean and rstd, log-sum-exps,
// the cross-entropy loss) stay f32 (kernels/checks.h stat_dtype); indices and masks are
// unchanged. The kernels that touch the most 16-bit data have 16-bit loops of their own:
// elementwise ops, axpy_/scale_/squared_norm (gradient accumulation) and the cross-entropy
// convert a chunk or a row at a time into f32 buffers (load_floats, store_floats), the
// embedding's backward sums each id's rows in f32 (acc_t) and rounds once into its row;
// bf16 matrix products run on Note [BF16 GEMM]
// (kernels/cpu/bf16_gemm.h), f16 ones on the packed f32 GEMM, which converts f16 as it packs
// (kernels/cpu/sgemm.h). Any other kernel runs its f32 loop on widened copies of its
// operands (`widened`) and rounds its results back (`narrowed`), and an in-place one
// updates a widened copy of its destination and writes it back rounded (`update_widened`),
// so each 16-bit value is rounded once per call either way. The copies use the bulk
// conversions of core/half_convert.h. A 16-bit gradient accumulated over several backward
// calls is rounded at each (ZeRO stages 0-1 keep the model's gradients in 16 bits across
// micro-batches: Note [Mixed precision] in parallel/zero/zero_optimizer.h).
#pragma once

#include <type_traits>

#include "core/allocator.h"
#include "core/half_convert.h"
#include "core/tensor.h"

namespace tessera::kernels::cpu {

// The type 16-bit math accumulates in: float for Half and BFloat16, T itself otherwise.
template <class T>
using acc_t = std::conditional_t<kIsHalf<T>, float, T>;

// Values per chunk of the loops that convert 16-bit operands through f32 buffers on the
// stack (8 KiB for a chunk's three operands and result: all in L1).
inline constexpr int64_t kHalfChunk = 512;

// Note [Aligned scratch]
// Eigen's vectorized assignment to a Map of unknown alignment computes the elements before
// the first packet-aligned address one at a time, and a transcendental (exp, tanh) takes a
// scalar path for those that can differ from the packet path in the last bit: the result
// depends on where the destination lies. Tensors are aligned (core/allocator.h
// kCpuAlignment), so that is fixed for a given shape; a buffer on the stack is not, and its
// address follows the stack depth (down to the length of the config file's path, which
// the kernel copies onto the stack at exec). A run must not depend on that: the f32 chunk
// buffers of the 16-bit loops are aligned as tensors are, with alignas(kCpuAlignment), and
// so are buffers on the heap (cross_entropy's rows, with Eigen's aligned allocator), whose
// address follows every allocation before them.

// out[i] = float(p[i * stride]) for i < n, `stride` in bytes (0: one value broadcast); in
// bulk when p is contiguous.
template <class T>
void load_floats(const char* p, int64_t stride, int64_t n, float* out) {
  static_assert(kIsHalf<T>);
  if (stride == static_cast<int64_t>(sizeof(T))) {
    if constexpr (std::is_same_v<T, BFloat16>) {
      bf16_to_f32(reinterpret_cast<const BFloat16*>(p), out, n);
    } else {
      f16_to_f32(reinterpret_cast<const Half*>(p), out, n);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(*reinterpret_cast<const T*>(p + i * stride));
}

// Rounds in[0, n) into the contiguous T values at p.
template <class T>
void store_floats(const float* in, int64_t n, T* p) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    f32_to_bf16(in, p, n);
  } else {
    static_assert(std::is_same_v<T, Half>);
    f32_to_f16(in, p, n);
  }
}

// `t` as f32 when it is f16 or bf16 (a contiguous copy, exact), `t` itself otherwise
// (undefined stays undefined).
Tensor widened(const Tensor& t);

// The f32 result `t` rounded to `dtype` when that is f16 or bf16, `t` itself otherwise.
Tensor narrowed(const Tensor& t, DType dtype);

// Runs `update(wide)` on a widened copy of the 16-bit tensor `dst` and writes the result
// back into `dst`, rounded; runs `update(dst)` itself when `dst` is not 16-bit.
template <class F>
void update_widened(const Tensor& dst, F&& update) {
  if (!is_half(dst.dtype())) {
    update(dst);
    return;
  }
  const Tensor wide = widened(dst);
  update(wide);
  dst.copy_(wide);
}

}  // namespace tessera::kernels::cpu
