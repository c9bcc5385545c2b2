// f16 and bf16 on the CPU: math in f32 between one widening and one rounding.
//
// Note [16-bit math on the CPU]
// Every CPU kernel takes f16 and bf16 tensors with the semantics of the CUDA kernels: the
// 16-bit operands are widened to f32 (exactly), every product, sum and transcendental is
// computed and accumulated in f32, and each 16-bit result is rounded once, to nearest even,
// from its f32 value. Row statistics and losses (layer-norm mean and rstd, log-sum-exps,
// the cross-entropy loss) stay f32 (kernels/checks.h stat_dtype); indices and masks are
// unchanged. A kernel without a 16-bit loop of its own runs its f32 loop on widened copies
// of its operands (`widened`), rounds its results back (`narrowed`), and an in-place
// kernel updates a widened copy of its destination and writes it back rounded
// (`update_widened`), so each of its 16-bit values is rounded once per call. The copies
// use the bulk conversions of core/half_convert.h.
#pragma once

#include "core/tensor.h"

namespace tessera::kernels::cpu {

// f16 or bf16.
bool is_half(DType dtype);

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
